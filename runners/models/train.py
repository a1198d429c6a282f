"""A plain training loop over a model spec: the "user's job" ``cptrace profile`` wraps.

``cptrace run`` owns its loop (ABBA arms, timing, profiler phases); real users own theirs. This
script is the latter for the model workloads, with nothing of cptrace's profiling in it::

    python -m runners.models.train runners/examples/te_transformer.yaml --steps 20
    torchrun --nproc-per-node 2 -m runners.models.train SPEC --steps 20
    cptrace profile --nsys --probe -- python -m runners.models.train SPEC --steps 20

It trains the spec's first variant (or ``--variant``) for ``--steps`` optimizer steps and prints
one JSON line with the step times (CUDA events on GPU), for benchmarks and the probe-overhead
measurement (``benchmarks/probe_overhead.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from runners.spec import load_spec, parse_spec


def _single_process_env() -> None:
    """A one-process group when started without torchrun/srun (``python -m ...``)."""
    if "RANK" in os.environ or "SLURM_PROCID" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def main(argv: list[str] | None = None) -> int:
    from runners.models import build_model_arm
    from runners.spec import layout_for
    from runners.workload import _init_distributed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="model spec (YAML) with a model: section")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--variant", default=None, help="variant to train (default: the first)")
    parser.add_argument("--results", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    spec = load_spec(args.spec)
    if spec.model is None:
        parser.error(f"{args.spec}: no model: section (this loop trains model workloads)")
    _single_process_env()
    world = int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or "1")
    spec = parse_spec({**spec.model_dump(mode="json"), "ranks": world}, source=str(args.spec))
    ctx = _init_distributed(spec)
    name = args.variant or spec.variant_names()[0]
    workload = spec.variant_workload(name)
    assert spec.model is not None  # checked above: the spec has a model: section
    arm = build_model_arm(name, spec.model, workload, layout_for(workload, spec.ranks), ctx)
    cuda = ctx.device.type == "cuda"
    times: list[float] = []
    for _ in range(args.steps):
        if cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            arm.step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            arm.step()
            times.append((time.perf_counter() - t0) * 1e3)
    dist.barrier()
    result = {
        "rank": ctx.rank,
        "variant": name,
        "steps": args.steps,
        "step_ms": [round(t, 4) for t in times],
        "median_ms_after_first": round(statistics.median(times[1:] or times), 4),
    }
    line = json.dumps(result)
    print(line, flush=True)
    if args.results is not None and ctx.rank == 0:
        args.results.write_text(line + "\n", encoding="utf-8")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
