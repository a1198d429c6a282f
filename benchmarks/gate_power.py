"""False positives and power of the pull-request gate (``pr_bot.policy.time_gate``).

Samples come from real captures: every arm of the demo bundles (and of any other bundle given)
with at least ``--min-pool`` ABBA-timed iterations is one pool of iteration times of one code
(the all-ranks time of an iteration: its slowest rank, as the analysis takes it). A trial picks
a pool (round robin), draws base and head samples of size n from it with replacement, multiplies
the head by 1 + shift, and runs the gate with the default thresholds. Shift 0 is identical code:
a "fail" there is a false positive. ``--trials`` trials per (shift, n); with ``--pooled K`` the
base is K draws of n (a baseline pooled from K base-branch runs) against one head of n.

Prints one table per base: the fraction of trials failing (regression), inconclusive and
passing (within the threshold, or an improvement) per shift and n.

``--captures A B``: the per-helper aggregate rules (``pr_bot.policy.helper_regressions``) on two
captures of the same workload, both ways, for every arm they share: the largest growth of a
helper's GPU and host time per step, and what the rules flag with the defaults.

    python benchmarks/gate_power.py
    python benchmarks/gate_power.py --pooled 5
    python demo/make_bundles.py --out "$TMPDIR/demo"   # the bundles built from demo/traces
    python benchmarks/gate_power.py --captures "$TMPDIR/demo"/te-2.20.2-kineto-3arms.tar.gz \
        demo/bundles/te-2.20.2-reference-3arms-h200x2.tar.gz
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzers import analyze, compare_reports  # noqa: E402
from analyzers.bundle import read_bundle  # noqa: E402
from analyzers.report import UNATTRIBUTED, AnalysisReport, Category  # noqa: E402
from analyzers.windows import WHOLE_TRACE  # noqa: E402
from pr_bot.deltas import host_rows_for  # noqa: E402
from pr_bot.policy import Thresholds, TimeOutcome, helper_regressions, time_gate  # noqa: E402

SHIFTS = (0.0, 0.05, 0.10, 0.50, 3.0)  # identical, +5%, +10%, +50%, 4x
SIZES = (3, 10, 20, 50)


def pools(paths: list[Path], min_pool: int) -> list[tuple[str, np.ndarray]]:
    """(bundle:arm, iteration times ms) of every arm with enough timed iterations."""
    out = []
    for path in paths:
        with read_bundle(path) as bundle:
            for variant in bundle.manifest.variants:
                by_rank = [v for _, v in sorted(variant.iteration_ms.items()) if v]
                if not by_rank or min(len(v) for v in by_rank) < min_pool:
                    continue
                n = min(len(v) for v in by_rank)
                times = np.max(np.array([v[:n] for v in by_rank]), axis=0)
                out.append((f"{path.name.removesuffix('.tar.gz')}:{variant.name}", times))
    return out


def run(
    samples: list[tuple[str, np.ndarray]], trials: int, pooled: int, seed: int
) -> dict[tuple[float, int], Counter[str]]:
    rng = np.random.default_rng(seed)
    thresholds = Thresholds()
    table: dict[tuple[float, int], Counter[str]] = {}
    for shift in SHIFTS:
        for n in SIZES:
            counts: Counter[str] = Counter()
            for trial in range(trials):
                _, pool = samples[trial % len(samples)]
                base = rng.choice(pool, n * pooled)
                head = (1.0 + shift) * rng.choice(pool, n)
                outcome = time_gate(base.tolist(), head.tolist(), thresholds).outcome
                counts[
                    "fail"
                    if outcome == TimeOutcome.REGRESSION
                    else "inconclusive"
                    if outcome == TimeOutcome.INCONCLUSIVE
                    else "pass"
                ] += 1
            table[(shift, n)] = counts
    return table


def _label(shift: float) -> str:
    return "identical" if shift == 0 else f"{1 + shift:g}x" if shift >= 1 else f"+{shift:.0%}"


def print_table(table: dict[tuple[float, int], Counter[str]], trials: int, pooled: int) -> None:
    base = f"base {pooled} x n (pooled from {pooled} runs)" if pooled > 1 else "base n"
    print(f"\n{base} vs head n; {trials} trials per cell; fail / inconclusive / pass\n")
    print("| head | " + " | ".join(f"n={n}" for n in SIZES) + " |")
    print("|---|" + "---|" * len(SIZES))
    for shift in SHIFTS:
        cells = []
        for n in SIZES:
            c = table[(shift, n)]
            cells.append(
                f"{c['fail'] / trials:.1%} / {c['inconclusive'] / trials:.1%} / "
                f"{c['pass'] / trials:.1%}"
            )
        print(f"| {_label(shift)} | " + " | ".join(cells) + " |")


def _largest(base_ns: list[float], head_ns: list[float], floor_ns: float) -> str:
    """The largest relative growth among helpers above ``floor_ns`` per step, and its size."""
    best = max(
        ((h / b - 1, b) for b, h in zip(base_ns, head_ns, strict=True) if b > floor_ns),
        default=None,
    )
    return "-" if best is None else f"{best[0]:+.0%} (of {best[1] / 1e6:.2f} ms)"


def captures(paths: list[Path]) -> None:
    """Print the helper rules' answer on two captures of one workload, both ways."""
    reports: list[AnalysisReport] = []
    for path in paths:
        with read_bundle(path) as bundle:
            reports.append(analyze(bundle.analysis_paths(), manifest=bundle.manifest))
    a, b = reports
    arms = [g for g in a.groups if g in b.groups and g != WHOLE_TRACE]
    print("\n| base -> head | arm | largest GPU growth | largest host growth | flagged |")
    print("|---|---|---|---|---|")
    for (x, nx), (y, ny) in (((a, paths[0]), (b, paths[1])), ((b, paths[1]), (a, paths[0]))):
        for arm in arms:
            c = compare_reports(x, y, base_window=arm, head_window=arm)
            rows = [d for d in c.helpers if d.helper != UNATTRIBUTED]
            gpu = [d for d in rows if d.category != Category.COMMUNICATION]
            flagged = helper_regressions(c, Thresholds(), host_rows_for(x, y, c))
            gpu_growth = _largest(
                [d.base_gpu_time_ns for d in gpu], [d.head_gpu_time_ns for d in gpu], 50_000
            )
            host_growth = _largest(
                [d.base_host_time_ns for d in rows], [d.head_host_time_ns for d in rows], 50_000
            )
            names = f"{nx.name.removesuffix('.tar.gz')} -> {ny.name.removesuffix('.tar.gz')}"
            print(
                f"| {names} | {arm} | {gpu_growth} | {host_growth} | "
                f"{'; '.join(flagged) or 'none'} |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", nargs="*", type=Path, help="default: demo/bundles/*.tar.gz")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--pooled", type=int, default=1, help="K base runs pooled (1: one run)")
    parser.add_argument("--min-pool", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--captures", nargs=2, type=Path, default=None, help="two bundles of one workload"
    )
    args = parser.parse_args()
    if args.captures:
        captures(args.captures)
        return 0
    paths = args.bundles or sorted((ROOT / "demo" / "bundles").glob("*.tar.gz"))
    samples = pools(paths, args.min_pool)
    if not samples:
        raise SystemExit("no arm with enough timed iterations in the bundles given")
    print(f"{len(samples)} pools of real iteration times:")
    for name, times in samples:
        print(f"  {name}: n={times.size}, median {np.median(times):.2f} ms, "
              f"IQR {np.subtract(*np.percentile(times, [75, 25])):.2f} ms")  # fmt: skip
    print_table(run(samples, args.trials, args.pooled, args.seed), args.trials, args.pooled)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
