"""What recording the line of each CUDA sync costs (``cptrace profile --torch``, on by default).

While the PyTorch profiler runs, ``runners.profile.synclines.SyncLineRecorder`` switches CUDA's
sync debug mode to ``warn`` and counts each warning at the user's frame. Two figures, each with
the recorder off and on, interleaved (ABAB) ``--repeats`` times, medians printed:

* one synchronizing call: ``--calls`` ``.item()`` of a CUDA scalar with nothing queued (the
  sync's own cost, so the recorder's share is as large as it can be);
* one training step of the MLP of a plain job (``Linear(2048, 8192)``, GELU,
  ``Linear(8192, 2048)``, AdamW, batch 4096, fp32) that reads its loss with
  ``.item()`` once per step (one sync a step), ``--steps`` steps per sample, CUDA-event timed.

Needs CUDA. ``python benchmarks/sync_lines_overhead.py --repeats 5``
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

from runners.profile.synclines import SyncLineRecorder  # noqa: E402


def _with_recorder(on: bool, work: Callable[[], float]) -> float:
    if not on:
        return work()
    with tempfile.TemporaryDirectory() as tmp:
        recorder = SyncLineRecorder(Path(tmp), rank=0)
        recorder.start()
        try:
            return work()
        finally:
            recorder.stop()


def item_us(calls: int) -> float:
    import torch

    scalar = torch.ones((), device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        scalar.item()
    return (time.perf_counter() - start) / calls * 1e6


def step_ms(steps: int) -> float:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 2048)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4096, 2048, device="cuda")
    y = torch.randn(4096, 2048, device="cuda")

    def one() -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()

    for _ in range(3):  # warm-up: allocator, cuBLAS handles
        one()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(steps):
        one()
    end.record()
    end.synchronize()
    return float(begin.elapsed_time(end)) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA: on CPU the recorder never switches warn mode on")
    torch.cuda.init()
    samples: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.repeats):
        for on in (False, True):
            samples.setdefault(("item", on), []).append(
                _with_recorder(on, lambda: item_us(args.calls)))
            samples.setdefault(("step", on), []).append(
                _with_recorder(on, lambda: step_ms(args.steps)))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, repeats {args.repeats}")
    print("| what | unit | recorder off | recorder on | difference |")
    print("|---|---|---|---|---|")
    for what, unit in (("item", "us per .item()"), ("step", "ms per step")):
        off = statistics.median(samples[(what, False)])
        on = statistics.median(samples[(what, True)])
        print(f"| {what} | {unit} | {off:.3f} | {on:.3f} | {on - off:+.3f} "
              f"({100 * (on - off) / off:+.2f}%) |")


if __name__ == "__main__":
    main()
