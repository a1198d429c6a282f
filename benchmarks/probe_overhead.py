"""Overhead of ``cptrace profile``'s rank side (step clock, rank status, probe) on a model workload.

Runs ``python -m runners.models.train SPEC`` alternately plain, with the bootstrap's step clock
and rank status only (what every ``cptrace profile`` run pays), and with the probe as well
(exactly the children's environment of ``cptrace profile --probe``), ``--repeats`` times each
(ABCABC), and prints a table: the median step time
(first step excluded) of each, the difference in percent, and the probe's own measured time on
its sampled calls, split into the host copies of the offsets (which wait for the stream's queued
work on a GPU) and the record writes, and the steady state: the cost of one sampled call times
the sampled calls per step once only 1 in ``--probe-every`` calls is inspected (what a long job
pays after its first ``--probe-first`` calls). Target: < 1 % of the step on the reference workload.

The step clock's own cost is measured apart, in this process: ``--clock-steps`` step boundaries
through ``runners.profile.steps`` (the same code the bootstrap installs) with an empty step,
per boundary, with ``time.perf_counter`` and, when CUDA is available, with CUDA events.

    python benchmarks/probe_overhead.py runners/examples/te_transformer.yaml --steps 60
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runners.profile.run import ProfileOptions, child_environment  # noqa: E402
from runners.profile.steps import StepBoundaries, StepClock  # noqa: E402


def _train(spec: Path, steps: int, env: dict[str, str], timeout: float) -> dict:
    cmd = [sys.executable, "-m", "runners.models.train", str(spec), "--steps", str(steps)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                         cwd=ROOT, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    line = [x for x in res.stdout.splitlines() if x.startswith("{")][-1]
    return json.loads(line)


ROUNDS = 5


def clock_cost_us(steps: int, *, cuda: bool) -> float:
    """Microseconds one step boundary costs with the clock on, over an empty step (the clock's
    begin + end, the lazy read-back of the CUDA events included; the final write excluded)."""
    import time

    import torch

    if cuda:
        torch.cuda.init()
        torch.zeros(1, device="cuda")
    with tempfile.TemporaryDirectory() as scratch:
        clock = StepClock(Path(scratch) / "steps_rank0.json", 0, "optimizer")
        timed = StepBoundaries(clock=clock)
        bare = StepBoundaries()
        costs = []
        for boundaries in (bare, timed) * ROUNDS:
            start = time.perf_counter()
            for _ in range(steps):
                boundaries.boundary()
            costs.append((time.perf_counter() - start) / steps * 1e6)
        clock.write(final=True)
        assert len(clock.ms) == ROUNDS * steps - 1, len(clock.ms)
    # the least-disturbed round of each (a shared machine's noise only ever adds time)
    return min(costs[1::2]) - min(costs[0::2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probe-first", type=int, default=16)
    parser.add_argument("--probe-every", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here too")
    parser.add_argument("--clock-steps", type=int, default=20_000)
    args = parser.parse_args()
    plain_env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    plain, clocked, probed, probe_ms, sampled = [], [], [], [], []
    copy_ms, dump_ms, calls = [], [], []
    for _ in range(args.repeats):
        plain.append(_train(args.spec, args.steps, plain_env, args.timeout))
        with tempfile.TemporaryDirectory() as scratch:
            env = child_environment(ProfileOptions(), Path(scratch))
            clocked.append(_train(args.spec, args.steps, env, args.timeout))
            timed = json.loads((Path(scratch) / "steps" / "steps_rank0.json").read_text())
            assert len(timed["ms"]) == args.steps - 1, "the clock missed steps"
        with tempfile.TemporaryDirectory() as scratch:
            opts = ProfileOptions(probe=True, probe_first=args.probe_first,
                                  probe_every=args.probe_every)
            env = child_environment(opts, Path(scratch))
            probed.append(_train(args.spec, args.steps, env, args.timeout))
            record = json.loads((Path(scratch) / "probe" / "probe_rank0.json").read_text())
            probe_ms.append(record["overhead_ms"])
            copy_ms.append(record.get("host_copy_ms", float("nan")))
            dump_ms.append(record.get("dump_ms", float("nan")))
            sampled.append(sum(s["sampled_calls"] for s in record["sites"].values()))
            calls.append(sum(s["calls"] for s in record["sites"].values()))
    a = statistics.median(r["median_ms_after_first"] for r in plain)
    c = statistics.median(r["median_ms_after_first"] for r in clocked)
    b = statistics.median(r["median_ms_after_first"] for r in probed)
    steps_total = args.steps * args.repeats
    per_step_probe = statistics.median(probe_ms) / args.steps
    rows = [
        ("plain", f"{a:.3f}", "", "", ""),
        ("step clock + status", f"{c:.3f}", f"{100 * (c - a) / a:+.2f}%", "", ""),
        ("--probe", f"{b:.3f}", f"{100 * (b - a) / a:+.2f}%",
         f"{statistics.median(sampled):.0f}", f"{per_step_probe:.4f}"),
    ]
    print(f"spec {args.spec}, {args.steps} steps x {args.repeats} repeats (ABCABC), "
          f"probe first={args.probe_first} every={args.probe_every}")
    print("| run | median step ms | vs plain | sampled calls/run | probe's own ms/step |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"probe's own time over the run: {statistics.median(probe_ms):.3f} ms "
          f"({100 * per_step_probe / a:.3f}% of a step on average over {args.steps} steps)")
    per_call = statistics.median(p / n for p, n in zip(probe_ms, sampled, strict=True) if n)
    calls_per_step = statistics.median(calls) / args.steps
    steady = per_call * calls_per_step / args.probe_every if args.probe_every else 0.0
    print(f"per sampled call: {per_call:.3f} ms (host copies {statistics.median(copy_ms):.3f} ms, "
          f"record writes {statistics.median(dump_ms):.3f} ms over the run); "
          f"{calls_per_step:.1f} wrapped calls per step")
    print(f"steady state (1 in {args.probe_every} calls): {steady:.4f} ms per step = "
          f"{100 * steady / a:.3f}% of the plain step")
    import torch

    clock = {"perf_counter": clock_cost_us(args.clock_steps, cuda=False)}
    if torch.cuda.is_available():
        clock["cuda_event"] = clock_cost_us(args.clock_steps, cuda=True)
    print(f"step clock, own cost per step ({args.clock_steps} empty steps, best of {ROUNDS}): "
          + ", ".join(f"{k} {v:.2f} us" for k, v in clock.items()))
    if args.json:
        args.json.write_text(json.dumps({
            "spec": str(args.spec), "steps": args.steps, "repeats": args.repeats,
            "plain_median_ms": a, "clock_median_ms": c, "probe_median_ms": b,
            "clock_us_per_step": clock, "probe_own_ms": probe_ms,
            "sampled_calls": sampled, "steps_total": steps_total, "calls": calls,
            "host_copy_ms": copy_ms, "dump_ms": dump_ms, "per_sampled_call_ms": per_call,
            "steady_state_ms_per_step": steady,
        }, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
