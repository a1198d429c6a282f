"""TE issue #1795 in miniature, on gloo: one rank raises before a collective, the others wait.

Rank ``--fail-rank`` raises before the all_reduce every rank must join, and its process does not
exit (a non-daemon thread stays alive, as NCCL's watchdog and destructor keep a real rank
alive); the other ranks block in the all_reduce. Without cptrace's watchdog this never ends.
"""

from __future__ import annotations

import argparse
import threading

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=8190)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    if dist.get_rank() == args.fail_rank:
        threading.Thread(target=threading.Event().wait, name="stays-alive").start()
        raise ValueError(
            f"packed token count {args.tokens} is not a multiple of 8 (FP8 GEMM dimension)"
        )
    dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
