"""The per-rank body of ``cptrace run``: build every arm, time them interleaved, profile them.

Started once per rank by ``runners/launch.py`` (torchrun, srun, or a CPU gloo launch)::

    python -m runners.workload --spec spec.json --out RUN_DIR --phases timed,torch

Phases, in this order within one process:

``timed``  ``warmup`` rounds, then ``iterations`` rounds; each round runs every arm once, in
           ABBA order (forward on even rounds, reversed on odd), so drift in clocks or
           temperature hits every arm alike. One CUDA-event pair per step (``perf_counter`` on
           CPU); no profiler attached.
``torch``  ``profiled_steps`` steps per arm under ``torch.profiler`` (step markers, Python
           stacks), one gzipped Chrome-trace JSON per rank.
``nsys``   the same steps between ``cudaProfilerStart/Stop``, for an ``nsys profile
           --capture-range=cudaProfilerApi`` wrapper around the launcher.

Every step of arm ``X`` runs inside ``record_function("arm:X")`` and an NVTX range of the same
name: the analyzers find each variant's window by that name. Each rank writes
``results/rank<r>.json`` (timings, per-variant facts) for the launcher to assemble.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cp_attention.ranges import named_range
from runners.arms import Arm, FullInputs, RankContext, build_arm, full_inputs
from runners.env import capture_environment
from runners.profile import rankstatus
from runners.profile.lean_start import without_inductor_import
from runners.spec import RunSpec, layout_for, parse_spec

PHASES = ("timed", "torch", "nsys")


def window_name(variant: str) -> str:
    """The annotation that encloses a variant's steps (``arm:<variant>``)."""
    return f"arm:{variant}"


def abba_order(arms: list[Arm], round_index: int) -> list[Arm]:
    """Arms in spec order on even rounds and reversed on odd rounds (A B B A A B ...)."""
    return arms if round_index % 2 == 0 else arms[::-1]


def _init_distributed(spec: RunSpec) -> RankContext:
    """Join the process group set up by the launcher (torchrun or srun environment)."""
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    use_cuda = spec.device == "cuda" or (spec.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    world = dist.get_world_size()
    if world != spec.ranks:
        raise RuntimeError(f"spec says ranks={spec.ranks} but the launcher started {world}")
    group = dist.group.WORLD
    assert group is not None  # set by init_process_group above
    return RankContext(rank=dist.get_rank(), world=world, group=group, device=device)


def build_arms(spec: RunSpec, ctx: RankContext) -> list[Arm]:
    """One arm per variant; variants with the same batch shape share one set of inputs."""
    if spec.model is not None:
        from runners.models import build_model_arm

        return [
            build_model_arm(
                name, spec.model, spec.variant_workload(name),
                layout_for(spec.variant_workload(name), spec.ranks), ctx,
            )
            for name in spec.variant_names()
        ]
    cache: dict[tuple[Any, ...], FullInputs] = {}
    arms = []
    for name in spec.variant_names():
        workload = spec.variant_workload(name)
        layout = layout_for(workload, spec.ranks)
        key = (
            workload.seed,
            layout.total_tokens,
            workload.heads,
            workload.kv_heads,
            workload.head_dim,
            workload.dtype,
        )
        if key not in cache:
            cache[key] = full_inputs(workload, layout, ctx.device)
        arms.append(build_arm(name, workload, layout, ctx, cache[key]))
    return arms


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_timed(spec: RunSpec, arms: list[Arm], device: torch.device) -> dict[str, list[float]]:
    """Warm-up, then timed ABBA rounds; returns ms per step for each arm.

    No arm window here: these steps are for timing and must stay out of any capture.
    """
    for r in range(spec.warmup):
        for arm in abba_order(arms, r):
            arm.step()
    _sync(device)
    pending: dict[str, list[Any]] = {arm.name: [] for arm in arms}
    for r in range(spec.iterations):
        for arm in abba_order(arms, r):
            if device.type == "cuda":
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                arm.step()
                end.record()
                pending[arm.name].append((start, end))
            else:
                t0 = time.perf_counter()
                arm.step()
                pending[arm.name].append((time.perf_counter() - t0) * 1e3)
    _sync(device)
    return {
        name: [e[0].elapsed_time(e[1]) if isinstance(e, tuple) else e for e in events]
        for name, events in pending.items()
    }


def _profiled_steps(spec: RunSpec, arms: list[Arm], device: torch.device, on_step: Any) -> None:
    """``profiled_steps`` consecutive steps per arm, each in its arm window."""
    for arm in arms:
        for _ in range(spec.profilers.profiled_steps):
            # The same record_function + NVTX pair cp_attention opens around its phases.
            with named_range(window_name(arm.name)):
                arm.step()
            on_step()
    _sync(device)


def run_torch_profiler(spec: RunSpec, arms: list[Arm], ctx: RankContext, out: Path) -> Path:
    """Profile with Kineto; write ``traces/kineto_rank<r>.json`` (gzipped by the launcher)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if ctx.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    opts = spec.profilers.torch
    # A schedule is what makes the profiler emit ProfilerStep#N markers; one warm-up step
    # (not exported) lets CUPTI settle before the first recorded step.
    active = len(arms) * spec.profilers.profiled_steps
    with ExitStack() as stack:
        with without_inductor_import():
            prof = stack.enter_context(
                profile(
                    activities=activities,
                    schedule=schedule(wait=0, warmup=1, active=active, repeat=1),
                    with_stack=opts.with_stack,
                    record_shapes=opts.record_shapes,
                )
            )

        def step() -> None:
            with without_inductor_import():
                prof.step()

        arms[0].step()
        _sync(ctx.device)  # its kernels must not spill into the first recorded step
        step()
        _profiled_steps(spec, arms, ctx.device, step)
    path = out / "traces" / f"kineto_rank{ctx.rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return path


def run_nsys_capture(spec: RunSpec, arms: list[Arm], ctx: RankContext) -> None:
    """The profiled steps inside the nsys capture range (``cudaProfilerStart/Stop``)."""
    if ctx.device.type != "cuda":
        raise RuntimeError("the nsys phase needs CUDA (nsys traces CUDA and NVTX)")
    # Barriers on both ends: the capture range is process-wide in nsys, so no rank may open it
    # late or close it while another rank's kernels still run.
    dist.barrier()
    torch.cuda.cudart().cudaProfilerStart()
    try:
        _profiled_steps(spec, arms, ctx.device, lambda: None)
        dist.barrier()
    finally:
        torch.cuda.cudart().cudaProfilerStop()


def first_steps_captured_on_failure(arms: list[Arm], ctx: RankContext, out: Path) -> None:
    """One step per arm under the PyTorch profiler, exported only if a step raises.

    A model that fails, fails in its first step (TE issue #1795: the first FP8 GEMM on a token
    count that is not a multiple of 8), before any profiled phase: this keeps what happened up
    to the exception, inside the arm's window, for the bundle. Steps that succeed are warm-up
    and their recording is dropped.
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if ctx.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities, with_stack=True)
    with without_inductor_import():
        prof.start()
    try:
        for arm in arms:
            with named_range(window_name(arm.name)):
                arm.step()
        _sync(ctx.device)
    except BaseException:
        prof.stop()
        path = out / "traces" / f"kineto_rank{ctx.rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        raise
    prof.stop()


def run_rank(spec: RunSpec, out: Path, phases: list[str]) -> dict[str, Any]:
    """Everything one rank does; returns the rank's result record."""
    ctx = _init_distributed(spec)
    result: dict[str, Any] = {"rank": ctx.rank, "world": ctx.world, "device": str(ctx.device)}
    if ctx.rank == 0:
        result["environment"] = capture_environment()
    try:
        arms = build_arms(spec, ctx)
        if spec.model is not None:
            first_steps_captured_on_failure(arms, ctx, out)
        if "timed" in phases:
            result["iteration_ms"] = run_timed(spec, arms, ctx.device)
        elif spec.warmup:  # profiled phases still need compiled kernels and warm caches
            run_timed(spec.model_copy(update={"iterations": 0}), arms, ctx.device)
        if "torch" in phases:
            result["kineto_trace"] = str(run_torch_profiler(spec, arms, ctx, out).name)
        if "nsys" in phases:
            run_nsys_capture(spec, arms, ctx)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point of one rank (``python -m runners.workload``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path, help="spec as JSON (from launch)")
    parser.add_argument("--out", required=True, type=Path, help="run directory")
    parser.add_argument("--phases", default="timed,torch", help=f"comma list of {PHASES}")
    args = parser.parse_args(argv)
    phases = [p for p in args.phases.split(",") if p]
    unknown = set(phases) - set(PHASES)
    if unknown:
        parser.error(f"--phases: unknown {sorted(unknown)}; choose from {PHASES}")
    spec = parse_spec(json.loads(args.spec.read_text()), source=str(args.spec))
    rankstatus.install_from_environment()  # the launcher's watchdog reads it (exceptions, waits)
    result = run_rank(spec, args.out, phases)
    target = args.out / "results" / f"rank{result['rank']}.{'-'.join(phases)}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
