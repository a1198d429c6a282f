"""Build small ``Trace`` objects by hand for unit tests of attribution, windows and metrics.

Real traces cover the realistic cases (see test_pipeline_real.py); these factories pin down edge
cases a real trace may not contain (a CUDA graph launch, a missing launch, equal timestamps).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analyzers.model import (
    ACTIVITY_DTYPE,
    LAUNCH_DTYPE,
    RANGE_DTYPE,
    ActivityKind,
    RangeKind,
    SymbolTable,
    Trace,
)


@dataclass
class TraceBuilder:
    """Accumulates rows; ``build()`` computes range parents/depths per thread like a reader."""

    fmt: str = "kineto"
    strings: SymbolTable = field(default_factory=SymbolTable)
    acts: list[tuple[object, ...]] = field(default_factory=list)
    launches: list[tuple[object, ...]] = field(default_factory=list)
    ranges: list[list[object]] = field(default_factory=list)
    ranks: dict[int, int] = field(default_factory=dict)
    _corr: int = 0

    def range(
        self,
        name: str,
        start: int,
        end: int,
        *,
        thread: int = 1,
        rank: int = 0,
        process: int = 100,
        kind: RangeKind = RangeKind.RECORD_FUNCTION,
    ) -> TraceBuilder:
        self.ranks[process] = rank
        self.ranges.append(
            [kind, rank, process, thread, start, end, self.strings.intern(name), -1, 0]
        )
        return self

    def kernel(
        self,
        name: str,
        launch_at: int | None,
        gpu_start: int,
        duration: int,
        *,
        thread: int = 1,
        rank: int = 0,
        process: int = 100,
        stream: int = 7,
        kind: ActivityKind = ActivityKind.KERNEL,
        api: str = "cudaLaunchKernel",
        correlation: int | None = None,
    ) -> int:
        """Add a GPU activity and (when ``launch_at`` is given) its launch; returns the corr id."""
        self.ranks[process] = rank
        if correlation is None:
            self._corr += 1
            correlation = self._corr
        self.acts.append(
            (
                kind,
                rank,
                process,
                0,
                stream,
                gpu_start,
                gpu_start + duration,
                self.strings.intern(name),
                correlation,
                -1,
                -1 if kind == ActivityKind.KERNEL else 0,
            )
        )
        if launch_at is not None:
            self.launches.append(
                (
                    rank,
                    process,
                    thread,
                    launch_at,
                    launch_at + 2,
                    correlation,
                    self.strings.intern(api),
                    False,
                )
            )
        return correlation

    def api_call(
        self,
        api: str,
        start: int,
        end: int,
        *,
        thread: int = 1,
        rank: int = 0,
        process: int = 100,
        sync: bool = True,
    ) -> None:
        """A runtime call without GPU work (e.g. cudaStreamSynchronize: ``sync``, as the
        readers mark it)."""
        self._corr += 1
        self.launches.append(
            (rank, process, thread, start, end, self._corr, self.strings.intern(api), sync)
        )

    def build(self) -> Trace:
        ranges = np.array([tuple(r) for r in self.ranges], dtype=RANGE_DTYPE)
        _nest(ranges)
        acts = np.array(self.acts, dtype=ACTIVITY_DTYPE)
        launches = np.array(self.launches, dtype=LAUNCH_DTYPE)
        times = [0]
        for table in (acts, launches, ranges):
            if len(table):
                times += [int(table["start"].min()), int(table["end"].max())]
        return Trace(
            source="factory",
            format=self.fmt,
            strings=self.strings,
            activities=acts,
            launches=launches,
            ranges=ranges,
            ranks=dict(self.ranks),
            span=(min(times), max(times)),
        )


def _nest(ranges: np.ndarray) -> None:
    """Fill parent/depth with a plain stack per thread (the reference the vectorized code meets)."""
    order = np.lexsort((-ranges["end"], ranges["start"], ranges["thread"]))
    stacks: dict[int, list[int]] = {}
    for row in order:
        stack = stacks.setdefault(int(ranges["thread"][row]), [])
        while stack and ranges["end"][stack[-1]] <= ranges["start"][row]:
            stack.pop()
        ranges["parent"][row] = stack[-1] if stack else -1
        ranges["depth"][row] = len(stack)
        stack.append(int(row))
