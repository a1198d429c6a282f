"""How much the step account (``analyzers.account``) adds to ``analyze``.

For each input, in this process: ``analyze`` end to end (read, attribute, windows, metrics, the
account, findings), then the account alone on the same analysis (``compute_accounts``, what the
pipeline calls), each the median of ``--repeat`` runs. The share is account / (analyze -
account): the cost over an analyze without it. Target: at most 20%.

Inputs: the real Kineto pair and nsys export of ``tests/data/te-2.20.2-h200x2`` (the HTA
comparison traces), and a large synthetic nsys export built by ``make_large_nsys.py`` (the real
export's rows replicated; ``--kernels``, default 300,000 to stay short on a shared CPU).

Usage::

    .venv/bin/python benchmarks/account_bench.py --kernels 300000 --repeat 3

Prints a table; it asserts nothing (benchmarks are not tests).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzers.account import compute_accounts  # noqa: E402
from analyzers.catalog import load_catalog  # noqa: E402
from analyzers.pipeline import Analysis, run_analysis  # noqa: E402

TE = ROOT / "tests/data/te-2.20.2-h200x2"


def _median_time(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _row(label: str, paths: list[Path], repeat: int, step_pattern: str | None) -> list[str]:
    catalog = load_catalog(use_env=False)
    total, an = _median_time(
        lambda: run_analysis(paths, step_pattern=step_pattern, catalog=catalog), repeat
    )
    assert isinstance(an, Analysis)

    def account() -> object:
        return compute_accounts(
            an.trace, an.attribution, an.ranges, catalog, an.report.windows, an.metrics.steps
        )

    alone, _ = _median_time(account, repeat)
    kernels = len(an.trace.activities)
    windows = len(an.report.windows)
    share = alone / max(total - alone, 1e-9)
    return [
        label,
        f"{kernels:,}",
        str(windows),
        f"{total:.3f}",
        f"{alone:.3f}",
        f"{100 * share:.1f}%",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-large", action="store_true")
    args = parser.parse_args(argv)
    rows = [
        _row(
            "kineto 3 arms, 2 ranks",
            [TE / "kineto_3arms_rank0.json.gz", TE / "kineto_3arms_rank1.json.gz"],
            args.repeat,
            "^arm:",
        ),
        _row("nsys 3 arms, 2 ranks", [TE / "nsys_3arms.sqlite.gz"], args.repeat, "^nsys_arm:"),
    ]
    if not args.skip_large:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import make_large_nsys

        with tempfile.TemporaryDirectory() as tmp:
            large = Path(tmp) / "large.sqlite"
            make_large_nsys.main(["--kernels", str(args.kernels), "--out", str(large)])
            rows.append(
                _row(
                    f"nsys synthetic ({args.kernels:,} kernels)", [large], args.repeat, "^nsys_arm:"
                )
            )
    header = ["input", "activities", "windows", "analyze s", "account s", "account adds"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    print(
        f"(median of {args.repeat} runs each; analyze includes the account; "
        "'account adds' = account / (analyze - account), target <= 20%)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
