"""The reference figures a user checks a profiler against: per device and per kernel name.

``device_figures``: per (rank, device), over the whole trace: kernel count and kernel-only time,
memcpy and memset counts, time and bytes, the kernel span, how many kernels joined a launch
row, and total GPU time (the sum of every activity's duration, not a union: busy time is the
timeline's job).

``kernel_table``: per kernel name what ``nsys stats --report cuda_gpu_kern_sum`` prints: count
(Instances), total, average, median, minimum, maximum, sample standard deviation (n - 1 in the
denominator; 0 for a single instance) and the share of the kernel time, per rank and summed
over ranks (``rank=None``, what nsys prints for a multi-process export).

Durations are ``end - start`` in integer ns; counts, totals, minima and maxima are exact
integers, the average, median and standard deviation are the only non-integers.

Each table (one window group, one rank or all ranks) lists at most ``MAX_KERNEL_ROWS`` names,
those with the most kernel time; the rest are one more row named ``OTHER_KERNELS`` whose
figures are those of all their instances together (``names`` says how many names it holds),
so the rows still add up to the group's kernel time and count. A trace of 5,000 distinct
4 KB kernel names (a 300 KB upload) made 43 MB of rows before (issue 24, item 6).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from analyzers.attribution import factorize
from analyzers.model import ActivityKind, Trace
from analyzers.report import DeviceFigures, KernelStat

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

MAX_KERNEL_ROWS = 100
"""Kernel names listed per table; the real TE traces have at most 44."""
OTHER_KERNELS = "(other kernel names)"
"""The name of the row that holds every name past ``MAX_KERNEL_ROWS``."""
_Row = tuple[int, int, int, int, float, float, int, int, float]


def device_figures(trace: Trace, rank: IntArray, launch: IntArray) -> list[DeviceFigures]:
    """The whole-trace figures of every (rank, device) with at least one activity.

    ``rank`` is each activity's rank (resolved through its launch where the reader left -1);
    ``launch`` its launch row (-1: none joined).
    """
    acts = trace.activities
    if len(acts) == 0:
        return []
    device = acts["device"].astype(np.int64)
    start, end = acts["start"].astype(np.int64), acts["end"].astype(np.int64)
    duration = end - start
    kind = acts["kind"]
    size = acts["bytes"].astype(np.int64)
    # (rank, device) as one int64 code: a handful of distinct values, factorized in O(n)
    code = (rank.astype(np.int64) << 16) | (device & 0xFFFF)
    [slot] = factorize(code)
    distinct = np.unique(code)
    keys = np.stack([distinct >> 16, ((distinct & 0xFFFF) ^ 0x8000) - 0x8000], axis=1)
    n = len(keys)

    def total(values: IntArray, mask: BoolArray) -> IntArray:
        out = np.zeros(n, dtype=np.int64)
        np.add.at(out, slot[mask], values[mask])
        return out

    def count(mask: BoolArray) -> IntArray:
        return np.bincount(slot[mask], minlength=n).astype(np.int64)

    is_kernel = kind == ActivityKind.KERNEL
    is_copy, is_set = kind == ActivityKind.MEMCPY, kind == ActivityKind.MEMSET
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, slot[is_kernel], start[is_kernel])
    np.maximum.at(last, slot[is_kernel], end[is_kernel])
    kernels, joined = count(is_kernel), count(is_kernel & (launch >= 0))
    known = size >= 0
    columns = {
        "kernel_time_ns": total(duration, is_kernel),
        "memcpy": count(is_copy),
        "memcpy_time_ns": total(duration, is_copy),
        "memcpy_bytes": total(size, is_copy & known),
        "memcpy_bytes_unknown": count(is_copy & ~known),
        "memset": count(is_set),
        "memset_time_ns": total(duration, is_set),
        "memset_bytes": total(size, is_set & known),
        "memset_bytes_unknown": count(is_set & ~known),
        "gpu_time_ns": total(duration, np.ones(len(acts), dtype=bool)),
    }
    out = []
    for i, (r, d) in enumerate(keys.tolist()):
        has_kernels = bool(kernels[i])
        out.append(
            DeviceFigures(
                rank=r,
                device=d,
                kernels=int(kernels[i]),
                kernel_first_ns=int(first[i]) if has_kernels else None,
                kernel_last_ns=int(last[i]) if has_kernels else None,
                kernel_span_ns=int(last[i] - first[i]) if has_kernels else 0,
                kernels_with_launch=int(joined[i]),
                kernels_without_launch=int(kernels[i] - joined[i]),
                **{name: int(values[i]) for name, values in columns.items()},
            )
        )
    return out


def _table(key: IntArray, name: IntArray, duration: IntArray) -> list[_Row]:
    """(key, name, count, total, average, median, min, max, stddev) per distinct (key, name).

    The rows must already be ordered by (name, duration); a stable sort by ``key`` (a radix sort
    of small integers) then orders them by (key, name, duration).
    """
    if len(duration) == 0:
        return []
    if len(key) > 1 and bool(np.any(key[1:] != key[:-1])):
        by_key = np.argsort(key, kind="stable")
        key, name, duration = key[by_key], name[by_key], duration[by_key]
    k, nm, d = key, name, duration
    new = np.ones(len(d), dtype=bool)
    new[1:] = (k[1:] != k[:-1]) | (nm[1:] != nm[:-1])
    first = np.flatnonzero(new)
    count = np.diff(np.append(first, len(d)))
    total = np.add.reduceat(d, first)
    mean = total / count
    lo_mid = first + (count - 1) // 2
    hi_mid = first + count // 2
    median = (d[lo_mid] + d[hi_mid]) / 2  # the middle one, or the mean of the two middle ones
    deviation = d - np.repeat(mean, count)
    squares = np.add.reduceat(deviation * deviation, first)
    stddev = np.sqrt(np.where(count > 1, squares / np.maximum(count - 1, 1), 0.0))
    return list(
        zip(
            k[first].tolist(),
            nm[first].tolist(),
            count.tolist(),
            total.tolist(),
            mean.tolist(),
            median.tolist(),
            d[first].tolist(),
            d[first + count - 1].tolist(),
            stddev.tolist(),
            strict=True,
        )
    )


def _name_duration_order(name: IntArray, duration: IntArray) -> IntArray:
    """Row order by (name, duration): one packed int64 key when it fits (a single argsort is
    several times faster than a two-key lexsort), else the lexsort."""
    if len(name) == 0:
        return np.empty(0, dtype=np.int64)
    low = int(duration.min())
    width = int(duration.max()) - low + 1
    if (int(name.max()) + 1) * width < (1 << 62) and int(name.min()) >= 0:
        return np.argsort(name * width + (duration - low), kind="stable")
    return np.lexsort((duration, name))


class KernelTables:
    """Per-kernel-name tables of any selection of a trace's kernels.

    The kernels are sorted by (name, duration) once; every window group's table is a masked,
    still sorted, subset of them, so a trace with several groups pays for one sort.
    """

    def __init__(self, trace: Trace, rank: IntArray) -> None:
        acts = trace.activities
        rows = np.flatnonzero(acts["kind"] == ActivityKind.KERNEL)
        duration = (acts["end"][rows] - acts["start"][rows]).astype(np.int64)
        name = acts["name"][rows].astype(np.int64)
        order = _name_duration_order(name, duration)
        self.trace = trace
        self.rows = rows[order]
        self.duration = duration[order]
        self.name = name[order]
        self.rank = rank[self.rows].astype(np.int64)

    def table(
        self, selected: BoolArray, group: str, steps: Mapping[tuple[int, str], int]
    ) -> list[KernelStat]:
        """Per kernel name, per rank and over all ranks (``rank=None``), of the kernels in
        ``selected`` (a mask over all activities: those placed in the group's windows); sorted
        by rank, then total time."""
        mask = selected[self.rows]
        duration, name, ranks = self.duration[mask], self.name[mask], self.rank[mask]
        all_steps = [s for (r, g), s in steps.items() if g == group]
        out = []
        for per_rank in (True, False):
            key = ranks if per_rank else np.zeros(len(duration), dtype=np.int64)
            table = _capped(_table(key, name, duration), key, name, duration)
            kernel_time: dict[int, int] = {}
            for k, _, _, tot, *_ in table:
                kernel_time[k] = kernel_time.get(k, 0) + tot
            for (k, nm, n, tot, avg, med, lo, hi, sd), names in zip(
                table, _names_per_row(table), strict=True
            ):
                out.append(
                    KernelStat(
                        rank=k if per_rank else None,
                        window=group,
                        steps=steps.get((k, group), 1) if per_rank else max(all_steps, default=1),
                        name=self.trace.strings[nm] if names == 1 else OTHER_KERNELS,
                        count=n,
                        total_ns=tot,
                        average_ns=avg,
                        median_ns=med,
                        min_ns=lo,
                        max_ns=hi,
                        stddev_ns=sd,
                        time_pct=100.0 * tot / kernel_time[k] if kernel_time[k] else 0.0,
                        names=names,
                    )
                )
        out.sort(key=lambda s: (s.rank is None, s.rank or 0, s.names > 1, -s.total_ns, s.name))
        return out


_OTHER = -1
"""``name`` of a folded row in ``_capped``'s output; its name count is in ``_names_per_row``."""


def _capped(rows: list[_Row], key: IntArray, name: IntArray, duration: IntArray) -> list[_Row]:
    """Per key, the ``MAX_KERNEL_ROWS`` rows with the most time, and one row (name ``-(n+1)``
    for ``n >= 2`` folded names) with the exact figures of all the other names' instances."""
    by_key: dict[int, list[_Row]] = {}
    for row in rows:
        by_key.setdefault(row[0], []).append(row)
    out: list[_Row] = []
    for k, group in by_key.items():
        if len(group) <= MAX_KERNEL_ROWS + 1:  # folding one name would save nothing
            out += group
            continue
        group.sort(key=lambda r: (-r[3], r[1]))
        kept, rest = group[:MAX_KERNEL_ROWS], group[MAX_KERNEL_ROWS:]
        folded = (key == k) & np.isin(name, [r[1] for r in rest])
        d = np.sort(duration[folded])
        zeros = np.zeros(len(d), dtype=np.int64)
        (whole,) = _table(zeros, zeros, d)  # all the folded instances as one name
        out += [*kept, (k, _OTHER - len(rest), *whole[2:])]
    return out


def _names_per_row(rows: list[_Row]) -> list[int]:
    """1 for a named row, the number of names a folded row holds."""
    return [_OTHER - nm if nm < 0 else 1 for _, nm, *_ in rows]


def kernel_table(
    trace: Trace,
    rank: IntArray,
    selected: BoolArray,
    group: str,
    steps: Mapping[tuple[int, str], int],
) -> list[KernelStat]:
    """One group's table (see ``KernelTables``; build that once for several groups)."""
    return KernelTables(trace, rank).table(selected, group, steps)


__all__ = ["KernelTables", "device_figures", "kernel_table"]
