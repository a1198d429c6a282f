"""A hung 2-rank job on gloo: rank ``--sleeper`` never reaches the barrier, the others wait in it.

No rank raises, so nothing but a hang detector ends it: ``cptrace profile --hang-timeout S``
sees a rank waiting in ``barrier`` for S seconds, asks every rank for its Python stack and stops
the job. The stacks must name the lines below: the sleeper's ``time.sleep`` and the waiter's
``dist.barrier``.
"""

from __future__ import annotations

import argparse
import time

import torch.distributed as dist


def wait_for_peers() -> None:
    dist.barrier()  # WAITING-LINE: the waiting rank is here


def work_forever() -> None:
    time.sleep(3600)  # SLEEPING-LINE: the hung rank is here


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleeper", type=int, default=1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    if dist.get_rank() == args.sleeper:
        work_forever()
    wait_for_peers()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
