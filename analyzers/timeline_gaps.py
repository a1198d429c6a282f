"""The idle gaps of the windows the dashboard timeline draws, from the step account.

Why: the run page reads stored reports only, and a stored account keeps only the largest
pieces per part (one per step, three per group); to draw every idle gap on the timeline,
labelled with its cause and helper ("idle: host-bound: get_cu_seqlens_on_cp_rank 1.2 ms"), the
report carries the idle pieces of
the drawn windows (one step per rank, ``Timeline.steps``) on the timeline's own clock. The
pieces are the account's (``analyzers.account.account_pieces``): the idle gap pieces and the
exposed NCCL time spent waiting for a later peer, so the drawn gaps add up to the account's idle
parts of those windows exactly; touching pieces of one cause are drawn as one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise

import numpy as np

from analyzers.account.build import Pieces, account_pieces
from analyzers.attribution import Attribution, RangeHelpers
from analyzers.catalog import Catalog
from analyzers.model import Trace
from analyzers.report import AccountPartKind, Timeline, TimelineGap, Window


def timeline_gaps(
    trace: Trace,
    att: Attribution,
    ranges: RangeHelpers,
    catalog: Catalog,
    windows: Sequence[Window],
    timelines: Sequence[Timeline],
    pieces_of: Callable[[Sequence[int]], Pieces] | None = None,
) -> list[Timeline]:
    """``timelines`` with the idle pieces of their windows (at most ``limit`` per rank, the
    longest; the rest counted in ``gaps_dropped``). ``pieces_of`` gives the pieces of the
    selected windows when an account already exists (``Accounts.pieces``, no second build).

    One account pass covers every drawn window when they are disjoint on each rank (the
    middle steps of different groups are); windows that overlap go one group at a time."""
    if not len(trace.activities):
        return list(timelines)
    wanted = [_drawn(t, windows) for t in timelines]
    everything = [i for sel in wanted for i in sel]
    if _disjoint([windows[i] for i in everything]):
        pieces = [_pieces(trace, att, ranges, catalog, windows, everything, pieces_of)] * len(
            timelines
        )
    else:
        pieces = [_pieces(trace, att, ranges, catalog, windows, sel, pieces_of) for sel in wanted]
    return [
        _with_gaps(t, p, windows, sel) if p is not None and sel else t
        for t, p, sel in zip(timelines, pieces, wanted, strict=True)
    ]


def _drawn(timeline: Timeline, windows: Sequence[Window]) -> list[int]:
    """Indices of the windows a timeline draws (one per rank)."""
    drawn = {(s.rank, s.window, s.index) for s in timeline.steps}
    return [
        i
        for i, w in enumerate(windows)
        if (w.group or w.name) == timeline.window and (w.rank, w.name, w.index) in drawn
    ]


def _disjoint(chosen: Sequence[Window]) -> bool:
    by_rank: dict[int, list[tuple[int, int]]] = {}
    for w in chosen:
        by_rank.setdefault(w.rank, []).append((w.start_ns, w.end_ns))
    for spans in by_rank.values():
        spans.sort()
        if any(b[0] < a[1] for a, b in pairwise(spans)):
            return False
    return True


def _pieces(
    trace: Trace,
    att: Attribution,
    ranges: RangeHelpers,
    catalog: Catalog,
    windows: Sequence[Window],
    selected: Sequence[int],
    pieces_of: Callable[[Sequence[int]], Pieces] | None,
) -> Pieces | None:
    if not selected:
        return None
    if pieces_of is not None:
        return pieces_of(selected)
    return account_pieces(trace, att, ranges, catalog, windows, selected)


def _with_gaps(
    timeline: Timeline, pieces: Pieces, windows: Sequence[Window], selected: Sequence[int]
) -> Timeline:
    origin = {(s.rank, s.window, s.index): s.origin_ns for s in timeline.steps}
    mine = {(w.rank, w.name, w.index, w.group) for w in (windows[i] for i in selected)}
    # idle gap pieces, and the exposed NCCL time spent waiting for a later peer (an
    # activity's share, but idle in the account: the GPU waits for another rank)
    peer = [i for i, line in enumerate(pieces.lines) if line.part == AccountPartKind.IDLE_PEER]
    idle = np.flatnonzero((pieces.unit >= pieces.activities) | np.isin(pieces.line, peer))
    idle = idle[np.lexsort((pieces.start[idle], pieces.seg[idle]))]
    merged: list[TimelineGap] = []
    for i in idle.tolist():
        w = pieces.windows[int(pieces.seg[i])].window
        if (w.rank, w.name, w.index, w.group) not in mine:
            continue  # another timeline's window (one pass covered them all)
        line = pieces.lines[int(pieces.line[i])]
        start = int(pieces.start[i]) - origin[(w.rank, w.name, w.index)]
        end = start + int(pieces.duration[i])
        last = merged[-1] if merged else None
        if (
            last is not None
            and last.rank == w.rank
            and last.end_ns == start
            and (last.part, last.label) == (line.part, line.label)
        ):
            last.end_ns = end
            continue
        merged.append(
            TimelineGap(rank=w.rank, start_ns=start, end_ns=end, part=line.part, label=line.label)
        )
    kept: list[TimelineGap] = []
    dropped = 0
    for rank in sorted({g.rank for g in merged}):
        gaps = sorted(
            (g for g in merged if g.rank == rank), key=lambda g: g.end_ns - g.start_ns, reverse=True
        )
        kept += sorted(gaps[: timeline.limit], key=lambda g: g.start_ns)
        dropped += max(len(gaps) - timeline.limit, 0)
    return timeline.model_copy(update={"gaps": kept, "gaps_dropped": dropped})


__all__ = ["timeline_gaps"]
