"""The idle gaps of the windows the dashboard timeline draws, from the step account.

Why: the run page reads stored reports only, and a stored account keeps the three largest
pieces per part; to draw every idle gap on the timeline, labelled with its cause and helper
("idle: host-bound: get_cu_seqlens_on_cp_rank 1.2 ms"), the report carries the idle pieces of
the drawn windows (one step per rank, ``Timeline.steps``) on the timeline's own clock. The
pieces are the account's (``analyzers.account.account_pieces``): the idle gap pieces and the
exposed NCCL time spent waiting for a later peer, so the drawn gaps add up to the account's idle
parts of those windows exactly; touching pieces of one cause are drawn as one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from analyzers.account.build import account_pieces
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
    timeline: Timeline | None,
) -> Timeline | None:
    """``timeline`` with the idle pieces of its windows (at most ``limit`` per rank, the
    longest; the rest counted in ``gaps_dropped``)."""
    if timeline is None or not timeline.steps or not len(trace.activities):
        return timeline
    drawn = {(s.rank, s.window, s.index): s.origin_ns for s in timeline.steps}
    selected = [
        i
        for i, w in enumerate(windows)
        if (w.group or w.name) == timeline.window and (w.rank, w.name, w.index) in drawn
    ]
    if not selected:
        return timeline
    pieces = account_pieces(trace, att, ranges, catalog, windows, selected)
    # idle gap pieces, and the exposed NCCL time spent waiting for a later peer (an
    # activity's share, but idle in the account: the GPU waits for another rank)
    peer = [i for i, line in enumerate(pieces.lines) if line.part == AccountPartKind.IDLE_PEER]
    idle = np.flatnonzero((pieces.unit >= pieces.activities) | np.isin(pieces.line, peer))
    idle = idle[np.lexsort((pieces.start[idle], pieces.seg[idle]))]
    merged: list[TimelineGap] = []
    for i in idle.tolist():
        w = pieces.windows[int(pieces.seg[i])].window
        origin = drawn[(w.rank, w.name, w.index)]
        line = pieces.lines[int(pieces.line[i])]
        start = int(pieces.start[i]) - origin
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
        mine = sorted(
            (g for g in merged if g.rank == rank), key=lambda g: g.end_ns - g.start_ns, reverse=True
        )
        kept += sorted(mine[: timeline.limit], key=lambda g: g.start_ns)
        dropped += max(len(mine) - timeline.limit, 0)
    return timeline.model_copy(update={"gaps": kept, "gaps_dropped": dropped})


__all__ = ["timeline_gaps"]
