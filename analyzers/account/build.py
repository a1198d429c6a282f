"""Where did the step go: every window's span split into parts that add up to it exactly.

Per window and rank, over the window's GPU timeline (``analyzers.timeline``: the same window
interval and the same clipping, so the totals equal its decomposition):

====================================  ==========================================================
part                                  what, attributed to
====================================  ==========================================================
compute                               union of computation (kernels that are not NCCL, and
                                      memsets), each instant to the activity that started first
                                      there; by its helper
exposed communication                 NCCL kernel time no computation overlaps; by collective
                                      (helper) and, inside a CP forward/backward container, by
                                      ring step (the i-th collective launched in that call)
idle: waiting on another rank         the part of that exposed NCCL time before the last rank
                                      taking part started its matching kernel (``peers``)
exposed memcpy                        memcpy time under neither computation nor NCCL; by helper
idle: host-bound / synchronisation    gaps with no GPU activity that the launching thread caused
                                      (``host``): the thread that launched the activity ending
                                      the gap had not returned from that launch when the gap
                                      began; split where the thread's state changes
idle: other                           gaps whose next activity was queued before the gap began
                                      (a stream dependency), or has no launch row
====================================  ==========================================================

The launch API time and the launch-to-start latency are inside the gap they end, so they count
as host-bound with the state the thread was in at that instant. A gap at the end of a window
(nothing starts before the window ends) belongs to the thread that launched the activity before
it. All in integer ns; the build checks ``sum(parts) == span`` for every window.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from analyzers.account.host import UNANNOTATED, HostStates, LabelType
from analyzers.account.peers import arrivals
from analyzers.attribution import Attribution, RangeHelpers, factorize
from analyzers.catalog import Catalog
from analyzers.metrics import gpu_activities
from analyzers.model import ActivityKind, Trace
from analyzers.report import (
    AccountPartKind,
    Category,
    GroupAccount,
    StepAccount,
    Window,
)
from analyzers.sweep import Owned, Union, owned
from analyzers.timeline import (
    Clipped,
    GpuTimeline,
    GroupClip,
    GroupUnions,
    TimelineWindow,
    clip_to_windows,
    group_unions,
    window_timelines,
)

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

LARGEST = 3
"""How many of the largest pieces each line of a group account keeps as evidence (and each
line of a step account whose group has one window per rank, e.g. the whole trace)."""
LARGEST_PER_STEP = 1
"""The same for the step accounts of a group with several windows on a rank: the largest piece
of each line in each step (the group account keeps ``LARGEST`` over all its steps). Why one:
at 2M kernels the 776 step accounts held 69,000 evidence pieces, the largest cost of the
account's output; every view reads the first one only."""
QUEUED = "queued before the gap (stream dependency)"
NO_LAUNCH = "no launch row for the next activity"
NO_WORK = "no GPU work in the window"
PART_ORDER = list(AccountPartKind)


@dataclass(slots=True)
class Accounts:
    """The account of every window and of every (rank, group), plus what it could not do."""

    steps: list[StepAccount] = field(default_factory=list)
    groups: list[GroupAccount] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    context: _Context | None = field(default=None, repr=False)
    """What the account was computed from, so ``pieces`` reuses it."""
    kept: list[_Kept] = field(default_factory=list, repr=False)
    """The pieces of the windows ``compute_accounts`` was asked to keep, per window group."""

    def pieces(self, selected: Sequence[int]) -> Pieces:
        """``account_pieces`` of these windows (indices into the windows given to
        ``compute_accounts``): the kept pieces when it kept them all (the same pieces, cut
        from the group's own pass), else a pass reusing the account's per-trace state."""
        if self.context is None:
            raise RuntimeError("an account without its context has no pieces")
        kept = {i for k in self.kept for i in k.ids.tolist()}
        if selected and all(i in kept for i in selected):
            return _kept_pieces(self.context, self.kept, selected)
        return _pieces(self.context, selected)


@dataclass(frozen=True, slots=True)
class _Kept:
    """A group pass's records and clipped rows of some of its windows; ``seg`` columns hold
    indices into the windows given to ``compute_accounts`` (``ids``)."""

    ids: IntArray
    records: tuple[IntArray, ...]  # seg, line, duration, start, thread code, unit
    clipped: tuple[IntArray, IntArray, IntArray, IntArray]  # seg, row, start, end


@dataclass(frozen=True, slots=True)
class Line:
    """One account line: a part and what it is attributed to."""

    part: AccountPartKind
    label: str
    category: Category | None = None
    detail: str | None = None


class _Lines:
    """Interns account lines to dense codes, so records are int arrays."""

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self._codes: dict[Line, int] = {}

    def code(self, line: Line) -> int:
        found = self._codes.get(line)
        if found is None:
            found = self._codes[line] = len(self.lines)
            self.lines.append(line)
        return found


@dataclass(slots=True)
class _Records:
    """Pieces of time: window (segment), line code, duration, start, thread, unit.

    ``unit`` identifies what a piece belongs to (an activity row, or a gap) so a part can count
    its gaps or activities once however many pieces they were cut into."""

    seg: list[IntArray] = field(default_factory=list)
    code: list[IntArray] = field(default_factory=list)
    dur: list[IntArray] = field(default_factory=list)
    start: list[IntArray] = field(default_factory=list)
    thread: list[IntArray] = field(default_factory=list)
    unit: list[IntArray] = field(default_factory=list)

    def add(
        self,
        seg: IntArray,
        code: IntArray,
        dur: IntArray,
        start: IntArray,
        thread: IntArray,
        unit: IntArray,
    ) -> None:
        keep = dur > 0
        every = bool(keep.all())
        for bucket, values in zip(
            (self.seg, self.code, self.dur, self.start, self.thread, self.unit),
            (seg, code, dur, start, thread, unit),
            strict=True,
        ):
            column = np.asarray(values, dtype=np.int64)
            bucket.append(column if every else column[keep])

    def arrays(self) -> tuple[IntArray, ...]:
        """The columns, each one array; the pieces are let go (the records of a whole-trace
        window are ~5M rows, and two copies of them would raise the account's peak)."""
        empty = np.empty(0, dtype=np.int64)
        out = []
        for bucket in (self.seg, self.code, self.dur, self.start, self.thread, self.unit):
            column = np.concatenate(bucket) if len(bucket) > 1 else bucket[0] if bucket else empty
            bucket[:] = [column]
            out.append(column)
        return tuple(out)


class _Context:
    """Everything per trace that the per-group passes share."""

    def __init__(
        self,
        trace: Trace,
        att: Attribution,
        ranges: RangeHelpers,
        catalog: Catalog,
        windows: Sequence[Window],
        gpu: GpuTimeline,
    ) -> None:
        self.trace, self.att, self.ranges, self.gpu = trace, att, ranges, gpu
        self.acts = gpu.acts
        self.rank = gpu.acts.rank
        self.lines = _Lines()
        launches = trace.launches
        has = np.flatnonzero(att.launch >= 0)
        # Per activity row, plus a trailing -1 that makes "no launch row" and "no owner"
        # (index -1) ordinary indices: the launching thread, its code and the launch end.
        self.l_thread = np.full(len(att.launch) + 1, -1, dtype=np.int64)
        self.l_end = np.full(len(att.launch) + 1, -1, dtype=np.int64)
        launch = att.launch[has]
        # contiguous copies first: gathers from a structured table's strided field cost twice
        self.l_thread[has] = np.ascontiguousarray(launches["thread"])[launch]
        self.l_end[has] = np.ascontiguousarray(launches["end"])[launch]
        self.l_start = gpu.acts.launched
        # Records carry dense thread codes (in thread id order), named once here.
        (self.l_tcode,) = factorize(self.l_thread)
        self.thread_ids = np.zeros(int(self.l_tcode.max()) + 1, dtype=np.int64)
        self.thread_ids[self.l_tcode] = self.l_thread
        self.peers = arrivals(trace, self.rank, self.acts.communication)
        self.comm_key, self.comm_lines = self._communication_lines()
        names = {w.name for w in windows}
        self.host = HostStates(trace, catalog, att, ranges, names)
        self.thread_labels = [self._thread_name(t) for t in self.thread_ids.tolist()]

    def helper_line(self, part: AccountPartKind, helper: int, detail: str | None = None) -> Line:
        return Line(part, self.att.name_of(helper), self.att.category_of(helper), detail)

    def _communication_lines(self) -> tuple[IntArray, dict[int, tuple[int, str]]]:
        """Per NCCL activity a key of its collective label: the helper, and inside a catalogued
        container (TE's CP forward/backward) the direction and the ring step, i.e. the index of
        the collective among that container call's collectives of the same helper."""
        n = len(self.att.helper)
        key = np.full(n, -1, dtype=np.int64)
        rows = np.flatnonzero(self.acts.communication)
        if len(rows) == 0:
            return key, {}
        helper = self.att.helper[rows].astype(np.int64)
        container = np.full(len(rows), -1, dtype=np.int64)
        has = self.l_thread[rows] >= 0
        container[has] = self.ranges.container.lookup(
            self.l_thread[rows][has], self.l_start[rows][has]
        )
        step = np.zeros(len(rows), dtype=np.int64)
        inside = np.flatnonzero(container >= 0)
        if len(inside):
            order = inside[
                np.lexsort((self.l_start[rows][inside], helper[inside], container[inside]))
            ]
            c, h = container[order], helper[order]
            new = np.ones(len(order), dtype=bool)
            new[1:] = (c[1:] != c[:-1]) | (h[1:] != h[:-1])
            group_start = np.maximum.accumulate(np.where(new, np.arange(len(order)), 0))
            step[order] = np.arange(len(order)) - group_start
        # A trailing -1 makes "no container" an ordinary index (the range table may be empty).
        c_helper = np.append(self.ranges.helper.astype(np.int64), -1)[container]
        width = 1 << 20
        local = ((helper + 1) * (len(self.att.helper_names) + 2) + (c_helper + 1)) * width + step
        local = np.where(
            container >= 0, local, (helper + 1) * (len(self.att.helper_names) + 2) * width - 1
        )
        key[rows] = local
        labels: dict[int, tuple[int, str]] = {}
        # ``local`` determines (helper, container helper, step): one row of each key names it
        codes, n_keys = _dense(local)
        holder = np.empty(n_keys, dtype=np.int64)
        holder[codes] = np.arange(len(local), dtype=np.int64)
        for k, h, ch, s in zip(
            local[holder].tolist(),
            helper[holder].tolist(),
            c_helper[holder].tolist(),
            step[holder].tolist(),
            strict=True,
        ):
            name = self.att.name_of(int(h))
            if ch >= 0:
                container_name = self.att.name_of(int(ch))
                direction = (
                    "bwd"
                    if "backward" in container_name
                    else "fwd"
                    if "forward" in container_name
                    else container_name
                )
                name = f"{name} {direction} step {int(s)}"
            labels[int(k)] = (int(h), name)
        return key, labels

    def _thread_name(self, thread: int) -> str | None:
        if thread < 0:
            return None
        return self.trace.thread_names.get(thread) or f"thread {thread}"


def _launch_order(clipped: Clipped, launched: IntArray) -> tuple[IntArray, IntArray] | None:
    """The clipped table (already in (window, start) order) with the rows tied at one
    (window, start) put in launch order, ties kept in table order (the same order as
    ``np.lexsort((launched[row], start, seg))``, without sorting the untied rows again), as
    (positions, the row each takes its place from); None when nothing is tied."""
    seg, start = clipped.seg, clipped.start
    n = len(seg)
    same = (seg[1:] == seg[:-1]) & (start[1:] == start[:-1])
    if not same.any():
        return None
    tied = np.zeros(n, dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    run = np.cumsum(np.concatenate(([True], ~same)))  # one id per (window, start) value
    pos = np.flatnonzero(tied)
    return pos, pos[np.lexsort((launched[clipped.row[pos]], run[pos]))]


def _owned(
    seg: IntArray, start: IntArray, end: IntArray, mask: BoolArray
) -> tuple[IntArray, IntArray, Owned]:
    """The rows of ``mask``, their windows and their owned pieces."""
    rows = np.flatnonzero(mask)
    mine = seg[rows]
    return rows, mine, owned(mine, start[rows], end[rows], in_order=True)


class _GroupPass:
    """The records of one or more window groups' windows (a group's windows may not overlap
    each other's activities twice: they are disjoint steps, or one whole-trace window per
    rank; every computation here is per window). Its rows are in (window, start) order, the
    clipped table's, so the sweeps skip checking it.

    Line codes: each ``_codes`` call hands out provisional codes; ``run`` ends by interning the
    lines in the order one pass per group would have met them (by group ``group_of``, then
    call, then key), so the codes, and with them every tie order, do not depend on how the
    groups were batched into passes."""

    def __init__(
        self,
        ctx: _Context,
        windows: Sequence[TimelineWindow],
        clipped: Clipped,
        unions: GroupUnions,
        group_of: IntArray | None = None,
    ) -> None:
        self.ctx = ctx
        self.windows = windows
        self.unions = unions  # the timeline's unions of ``clipped``: subtracted, never rebuilt
        self.records = _Records()
        self.group_of = (
            np.zeros(len(windows), dtype=np.int64) if group_of is None else group_of
        )  # per window: its group's position in the pass
        self._several = bool(len(windows)) and int(self.group_of.max()) > 0
        self._pending: list[Line] = []
        self._pending_group: list[IntArray] = []
        # Ties at one instant go to the activity launched first (the sweeps are stable);
        # tied rows share their window and start, so only ends and rows move.
        self.seg, self.start = clipped.seg, clipped.start
        self.end, self.row = clipped.end, clipped.row
        tied = _launch_order(clipped, ctx.l_start)
        if tied is not None:
            pos, source = tied
            self.end, self.row = self.end.copy(), self.row.copy()
            self.end[pos], self.row[pos] = clipped.end[source], clipped.row[source]
        self.win_start = np.array([w.start_ns for w in windows], dtype=np.int64)
        self.win_end = np.array([w.end_ns for w in windows], dtype=np.int64)

    def run(self) -> _Records:
        acts, row = self.ctx.acts, self.row
        kind = acts.kind[row]
        nccl = acts.communication[row]
        computation = ((kind == ActivityKind.KERNEL) & ~nccl) | (kind == ActivityKind.MEMSET)
        self._compute(computation)
        self._communication(nccl, self.unions.computation)
        self._memcpy(kind == ActivityKind.MEMCPY, self.unions.with_nccl)
        self._idle()
        self._finish()
        return self.records

    def _codes(self, keys: IntArray, seg: IntArray, line_of: Callable[[int], Line]) -> IntArray:
        """Provisional line codes for per-record ``keys`` (records in windows ``seg``): records
        with equal keys share a line, made once per distinct key by ``line_of(i)`` from one
        record ``i`` holding it; numbered in key order after the earlier calls' codes."""
        if len(keys) == 0:
            return np.empty(0, dtype=np.int64)
        local, n = _dense(keys)
        holder = np.empty(n, dtype=np.int64)
        holder[local] = np.arange(len(keys), dtype=np.int64)  # any record of each key
        first = np.zeros(n, dtype=np.int64)  # the first group holding each key
        if self._several:
            first[:] = np.iinfo(np.int64).max
            np.minimum.at(first, local, self.group_of[seg])
        base = len(self._pending)
        self._pending += [line_of(i) for i in holder.tolist()]
        self._pending_group.append(first)
        return local + base

    def _finish(self) -> None:
        """Intern the pending lines by (first group, provisional code) and renumber the
        records' codes."""
        if not self._pending:
            return
        group = np.concatenate(self._pending_group)
        order = np.argsort(group, kind="stable")  # provisional codes ascend within a group
        table = np.empty(len(self._pending), dtype=np.int64)
        table[order] = [self.ctx.lines.code(self._pending[i]) for i in order.tolist()]
        self.records.code[:] = [table[c] for c in self.records.code]
        self._pending, self._pending_group = [], []

    def _add(
        self, seg: IntArray, r: IntArray, code: IntArray, dur: IntArray, start: IntArray
    ) -> None:
        """Records of activities ``r`` (rows of the activity table) in windows ``seg``."""
        self.records.add(seg, code, dur, start, self.ctx.l_tcode[r], r)

    def _helper_codes(self, part: AccountPartKind, seg: IntArray, r: IntArray) -> IntArray:
        helper = self.ctx.att.helper[r].astype(np.int64)
        # keys helper + 1: small non-negative ints, coded by counting (-1 is "unattributed")
        return self._codes(helper + 1, seg, lambda i: self.ctx.helper_line(part, int(helper[i])))

    def _compute(self, mask: BoolArray) -> None:
        """Computation by helper: each activity's first-come share of the union."""
        rows, seg, mine = _owned(self.seg, self.start, self.end, mask)
        r = self.row[rows]
        code = self._helper_codes(AccountPartKind.COMPUTE, seg, r)
        self._add(seg, r, code, mine.length, mine.piece_start)

    def _communication(self, mask: BoolArray, comp: Union) -> None:
        rows, seg, mine = _owned(self.seg, self.start, self.end, mask)
        if len(rows) == 0:
            return
        lo, hi = mine.piece_start, mine.piece_end
        r = self.row[rows]
        last = self.ctx.peers.last_start[r]
        wait_end = np.where(last >= 0, np.clip(last, lo, hi), lo)
        # computation covering [lo, hi) and [lo, wait_end) (lo <= wait_end <= hi)
        before_lo = comp.before(seg, lo)
        exposed = (hi - lo) - (comp.before(seg, hi) - before_lo)
        waiting = (wait_end - lo) - (comp.before(seg, wait_end) - before_lo)
        keys = self.ctx.comm_key[r]
        lines = self.ctx.comm_lines
        category = self.ctx.att.category_of

        def comm(i: int) -> Line:
            h, name = lines[int(keys[i])]
            return Line(AccountPartKind.EXPOSED_COMMUNICATION, name, category(h))

        self._add(seg, r, self._codes(keys, seg, comm), exposed - waiting, lo)
        peer_rank = self.ctx.peers.last_rank[r]

        def peer(i: int) -> Line:
            h, name = lines[int(keys[i])]
            pr = int(peer_rank[i])
            late = f"last to arrive: rank {pr}" if pr >= 0 else None
            return Line(AccountPartKind.IDLE_PEER, name, category(h), late)

        peer_keys = keys * 1024 + (peer_rank + 1)
        self._add(seg, r, self._codes(peer_keys, seg, peer), waiting, lo)

    def _memcpy(self, mask: BoolArray, busy: Union) -> None:
        rows, seg, mine = _owned(self.seg, self.start, self.end, mask)
        if len(rows) == 0:
            return
        lo, hi = mine.piece_start, mine.piece_end
        exposed = (hi - lo) - busy.covered(seg, lo, hi)
        r = self.row[rows]
        helper = self.ctx.att.helper[r].astype(np.int64)
        name = self.ctx.trace.activities["name"][r].astype(np.int64)
        keys = (helper + 1) * (len(self.ctx.trace.strings) + 1) + name
        strings = self.ctx.trace.strings

        def make(i: int) -> Line:
            kind = strings[int(name[i])]
            return self.ctx.helper_line(AccountPartKind.EXPOSED_MEMCPY, int(helper[i]), kind)

        self._add(seg, r, self._codes(keys, seg, make), exposed, lo)

    def _idle(self) -> None:
        ctx = self.ctx
        union = Union.of(self.seg, self.start, self.end, with_rows=True, in_order=True)
        gaps = union.gaps(self.win_start, self.win_end)
        n = len(gaps.start)
        if n == 0:
            return
        # The activity that ends the gap launched it; a trailing gap (no next piece: at most
        # one per window, so fixed up on its own) goes to the previous one's launching thread.
        owner = np.full(n, -1, dtype=np.int64)
        has_next = gaps.next >= 0
        if len(union.start):
            owner = self.row[union.first_row[np.maximum(gaps.next, 0)]]
            trailing = np.flatnonzero(~has_next)
            before = gaps.prev[trailing]
            owner[trailing] = np.where(
                before >= 0, self.row[union.last_row[np.maximum(before, 0)]], -1
            )
        code = ctx.l_tcode[owner]
        thread = ctx.thread_ids[code]  # a table of the few threads: no second large gather
        l_end = ctx.l_end[owner]
        host = (thread >= 0) & (~has_next | (l_end > gaps.start))
        other = np.flatnonzero(~host)
        gap_unit = len(ctx.att.helper)  # gaps are units numbered after the activity rows
        # 0: no work, 1: no launch row, 2: queued
        why = np.where(owner[other] < 0, 0, np.where(thread[other] < 0, 1, 2))
        reasons = (NO_WORK, NO_LAUNCH, QUEUED)
        o_seg, o_start = gaps.seg[other], gaps.start[other]
        self.records.add(
            o_seg,
            self._codes(why, o_seg, lambda i: Line(AccountPartKind.IDLE_OTHER, reasons[why[i]])),
            gaps.end[other] - o_start,
            o_start,
            code[other],
            other + gap_unit,
        )
        q = np.flatnonzero(host)
        q_end = gaps.end[q]
        cut = np.where(has_next[q], np.minimum(l_end[q], q_end), q_end)
        which, lo, hi, interval = ctx.host.split(thread[q], gaps.start[q], cut, q_end)
        gap = q[which]
        labels = ctx.host.labels(thread[gap], lo, interval)
        g_seg = gaps.seg[gap]
        width = len(ctx.trace.strings) + len(ctx.att.helper_names) + 2
        keys = (labels.type * width + labels.value + 1) * (width + 1) + labels.detail + 1

        def make(i: int) -> Line:
            return self._host_line(int(labels.type[i]), int(labels.value[i]), int(labels.detail[i]))

        self.records.add(
            g_seg, self._codes(keys, g_seg, make), hi - lo, lo, code[gap], gap + gap_unit
        )

    def _host_line(self, label_type: int, value: int, detail: int) -> Line:
        strings = self.ctx.trace.strings
        if label_type == LabelType.SYNC:
            return Line(
                AccountPartKind.IDLE_SYNC,
                strings[value],
                None,
                f"in {strings[detail]}" if detail >= 0 else None,
            )
        if label_type == LabelType.HELPER:
            return self.ctx.helper_line(AccountPartKind.IDLE_HOST, value)
        if label_type == LabelType.RANGE:
            return Line(AccountPartKind.IDLE_HOST, strings[value])
        return Line(AccountPartKind.IDLE_HOST, UNANNOTATED)


def _sorted_distinct(values: IntArray) -> IntArray:
    """Distinct values by sorting (numpy's hash-based ``unique`` is slow on wide int keys)."""
    v = np.sort(values)
    keep = np.ones(len(v), dtype=bool)
    keep[1:] = v[1:] != v[:-1]
    return v[keep]


def _dense(values: IntArray) -> tuple[IntArray, int]:
    """Dense codes 0..n-1 of any int64 values (in value order) and n: by counting when the
    values are small non-negative ints, else by ``factorize`` (a few O(n) passes when there
    are few distinct values, a sort otherwise)."""
    lo, hi = int(values.min()), int(values.max())
    if lo >= 0 and hi < 4 * len(values) + 1024:
        return _dense_small(values)
    (local,) = factorize(values)
    return local, int(local.max()) + 1


def _dense_small(values: IntArray) -> tuple[IntArray, int]:
    """Dense codes of small non-negative ints (window x line keys), by counting, no sort."""
    present = np.bincount(values) > 0
    table = np.cumsum(present) - 1
    return table[values].astype(np.int64, copy=False), int(present.sum())


PartDict = dict[str, object]
"""An ``AccountPart`` as the dict pydantic validates: the evidence of a whole account is built
as plain dicts and validated once per account (in pydantic's core), not object by object."""
_PART_RANK = {kind: i for i, kind in enumerate(PART_ORDER)}


def _summaries(
    ctx: _Context,
    bucket: IntArray,
    records: tuple[IntArray, ...],
    windows: Sequence[TimelineWindow],
    n_codes: int,
    per_window: bool,
    largest: IntArray,
) -> dict[int, list[PartDict]]:
    """Per bucket (a window, or a rank), its account lines: records grouped by (bucket, line)
    with plain int64 keys (two sorts, no structured sort), each line's total, distinct units,
    main thread and its ``largest[bucket]`` longest pieces.

    ``per_window``: the buckets are the windows, where an activity has at most one record per
    line (its share of one part in one window), so only gap pieces need distinct counting."""
    seg, code, dur, start, thread, unit = records
    if len(dur) == 0:
        return {}
    key_code, n_keys = _dense_small(bucket * n_codes + code)
    small = key_code.astype(np.int16) if n_keys < (1 << 15) else key_code
    order = np.argsort(small, kind="stable")  # radix sort on small keys
    k = key_code[order]
    heads = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
    d = dur[order]
    totals = np.add.reduceat(d, heads).tolist()
    span = int(unit.max()) + 1
    if per_window:
        idle = unit >= len(ctx.att.helper)  # gap units are numbered after the activity rows
        units = np.bincount(key_code[~idle], minlength=n_keys)
        if idle.any():
            # The pieces of one gap are consecutive records, so in the stable key order its
            # pieces of one line are adjacent: count the runs of (line, gap).
            u = unit[order]
            run = u >= len(ctx.att.helper)
            run[1:] &= (k[1:] != k[:-1]) | (u[1:] != u[:-1])
            units += np.bincount(k[run], minlength=n_keys)
    else:
        units = np.bincount(_sorted_distinct(key_code * span + unit) // span, minlength=n_keys)
    # ``thread`` holds thread codes (``_Context.l_tcode``, in thread id order): the argmax
    # picks the thread with most time, ties the lowest id
    names = ctx.thread_labels
    n_threads = len(names)
    per_thread = np.bincount(
        key_code * n_threads + thread, weights=dur, minlength=n_keys * n_threads
    ).reshape(n_keys, n_threads)
    main_thread = [names[t] for t in per_thread.argmax(axis=1).tolist()]
    # the largest pieces of every line, gathered column-wise (-1: the line has fewer)
    first = order[heads]
    top = _largest(d, heads, order, int(largest.max()))
    have = (top >= 0) & (np.arange(len(top))[:, None] < largest[bucket[first]][None, :])
    rows = top[have]
    w_start = np.array([w.start_ns for w in windows], dtype=np.int64)
    starts = start[rows]
    gaps = [
        {
            "start_ns": a,
            "offset_ns": o,
            "duration_ns": du,
            "window": windows[g].window.name,
            "index": windows[g].window.index,
            "thread": names[t],
        }
        for a, o, du, g, t in zip(
            starts.tolist(),
            (starts - w_start[seg[rows]]).tolist(),
            dur[rows].tolist(),
            seg[rows].tolist(),
            thread[rows].tolist(),
            strict=True,
        )
    ]
    per_key: list[list[PartDict]] = [[] for _ in range(n_keys)]
    for key, gap in zip(np.nonzero(have)[1].tolist(), gaps, strict=True):
        per_key[key].append(gap)  # rows of ``top`` are ranks 0, 1, 2: longest first
    out: dict[int, list[PartDict]] = {}
    lines = ctx.lines.lines
    for b, c, t, u, largest, th in zip(
        bucket[first].tolist(),
        code[first].tolist(),
        totals,
        units.tolist(),
        per_key,
        main_thread,
        strict=True,
    ):
        line = lines[c]
        out.setdefault(b, []).append(
            {
                "part": line.part,
                "label": line.label,
                "category": line.category,
                "time_ns": t,
                "gaps": u,
                "largest": largest,
                "thread": th,
                "detail": line.detail,
            }
        )
    for parts in out.values():
        parts.sort(key=lambda p: (_PART_RANK[p["part"]], -p["time_ns"], p["label"]))  # type: ignore[index, operator]
    return out


def _largest(d: IntArray, heads: IntArray, order: IntArray, count: int) -> IntArray:
    """Record indices of the ``count`` longest records of each key segment, one row per
    rank (longest first), -1 where a segment has fewer.

    Repeated segment maxima of ``duration * n + (n - 1 - position)``: the position rides in
    the low digits, so the maximum names its record (ties: the earliest); no sort by duration.
    """
    n = len(d)
    if n == 0:
        return np.empty((count, 0), dtype=np.int64)
    cols = []
    if int(d.max()) * n >= (1 << 62):  # too wide to encode: sort instead
        by = np.lexsort((-d, np.repeat(np.arange(len(heads)), np.diff(np.append(heads, n)))))
        ends = np.append(heads[1:], n)
        for j in range(count):
            pos = heads + j
            cols.append(np.where(pos < ends, order[by[np.minimum(pos, n - 1)]], -1))
        return np.stack(cols)
    enc = d * n + (n - 1 - np.arange(n, dtype=np.int64))
    for _ in range(count):
        best = np.maximum.reduceat(enc, heads)
        hit = best >= 0
        pos = n - 1 - (best % n)
        cols.append(np.where(hit, order[np.where(hit, pos, 0)], -1))
        enc[pos[hit]] = -1
    return np.stack(cols)


def compute_accounts(
    trace: Trace,
    att: Attribution,
    ranges: RangeHelpers,
    catalog: Catalog,
    windows: Sequence[Window],
    steps: Mapping[tuple[int, str], int],
    gpu: GpuTimeline,
    keep: Collection[int] = (),
) -> Accounts:
    """The account of every window of ``windows`` and of every (rank, window group), over the
    windows and clipped activities of their GPU timeline ``gpu`` (``Metrics.gpu``). ``keep``:
    windows (indices into ``windows``) whose pieces ``Accounts.pieces`` will be asked for (the
    run page's drawn steps), kept from the group passes instead of computed again.

    :raises RuntimeError: when a window's parts do not add up to its span (a bug, never input).
    """
    return _accounts(trace, att, ranges, catalog, windows, steps, gpu, set(keep))


def _accounts(
    trace: Trace,
    att: Attribution,
    ranges: RangeHelpers,
    catalog: Catalog,
    windows: Sequence[Window],
    steps: Mapping[tuple[int, str], int],
    gpu: GpuTimeline,
    keep: set[int],
) -> Accounts:
    ctx = _Context(trace, att, ranges, catalog, windows, gpu)
    result = Accounts(notes=list(ctx.peers.notes), context=ctx)
    for batch in _batches(list(gpu.groups.items())):
        _account_batch(ctx, result, batch, steps, keep)
    return result


BATCH_ROWS = 1 << 20
"""Consecutive window groups share one pass while their clipped rows add up to at most this
many (a pass costs ~200 numpy calls whatever its size; a bigger group goes alone, with no
copy of its rows)."""


def _batches(groups: list[tuple[str, GroupClip]]) -> list[list[tuple[str, GroupClip]]]:
    out: list[list[tuple[str, GroupClip]]] = []
    rows = 0
    for item in groups:
        n = len(item[1].clipped.seg)
        if out and rows + n <= BATCH_ROWS:
            out[-1].append(item)
            rows += n
        else:
            out.append([item])
            rows = n
    return out


def _account_batch(
    ctx: _Context,
    result: Accounts,
    batch: list[tuple[str, GroupClip]],
    steps: Mapping[tuple[int, str], int],
    keep: set[int],
) -> None:
    """The step and group accounts of the groups of ``batch``, from one pass over all their
    windows (each group's windows numbered after the previous group's)."""
    tw = [w for _, clip in batch for w in clip.windows]
    ids = np.array([i for _, clip in batch for i in clip.ids], dtype=np.int64)
    sizes = [len(clip.windows) for _, clip in batch]
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    group_of = np.repeat(np.arange(len(batch), dtype=np.int64), sizes)
    unions = GroupUnions(
        *(
            Union.concat([getattr(clip.unions, f) for _, clip in batch], offsets[:-1].tolist())
            for f in ("computation", "with_nccl")
        )
    )
    if len(batch) == 1:
        clipped = batch[0][1].clipped
    else:
        clips = [clip.clipped for _, clip in batch]
        clipped = Clipped(
            np.concatenate([c.seg + o for c, o in zip(clips, offsets.tolist(), strict=False)]),
            np.concatenate([c.start for c in clips]),
            np.concatenate([c.end for c in clips]),
            np.concatenate([c.row for c in clips]),
        )
    group_pass = _GroupPass(ctx, tw, clipped, unions, group_of)
    records = group_pass.run().arrays()
    drawn = [i for i, g in enumerate(ids.tolist()) if g in keep]
    if drawn:
        result.kept.append(_keep(group_pass, records, ids, drawn))
    seg = records[0]
    n_codes = max(len(ctx.lines.lines), 1)
    rank_of = np.array([w.window.rank for w in tw], dtype=np.int64)
    # per group: its ranks, and whether it has one window per rank (the whole trace: its
    # step and group lines are the same)
    ranks = [sorted(set(rank_of[a:b].tolist())) for a, b in itertools.pairwise(offsets.tolist())]
    one_per_rank = [len(r) == n for r, n in zip(ranks, sizes, strict=True)]
    largest = np.array(
        [LARGEST if one else LARGEST_PER_STEP for one in one_per_rank], dtype=np.int64
    )[group_of]
    per_window = _summaries(ctx, seg, records, tw, n_codes, per_window=True, largest=largest)
    _check_spans(tw, per_window)
    # rank buckets of the groups with several windows per rank, numbered group by group
    bucket_of = np.full(len(tw), -1, dtype=np.int64)
    rank_bucket: list[dict[int, int]] = []
    n_buckets = 0
    for g, (a, b) in enumerate(itertools.pairwise(offsets.tolist())):
        mine = {} if one_per_rank[g] else {r: n_buckets + i for i, r in enumerate(ranks[g])}
        n_buckets += len(mine)
        rank_bucket.append(mine)
        for i in range(a, b):
            if mine:
                bucket_of[i] = mine[int(rank_of[i])]
    per_rank: dict[int, list[PartDict]] = {}
    if n_buckets:
        bucket = bucket_of[seg]
        if bool((bucket < 0).any()):
            inside = bucket >= 0
            records = tuple(column[inside] for column in records)
            bucket = bucket[inside]
        group_largest = np.full(n_buckets, LARGEST, dtype=np.int64)
        per_rank = _summaries(
            ctx, bucket, records, tw, n_codes, per_window=False, largest=group_largest
        )
    for g, (group, clip) in enumerate(batch):
        a = int(offsets[g])
        for i, w in enumerate(clip.windows):
            result.steps.append(
                StepAccount.model_validate(
                    {
                        "rank": w.window.rank,
                        "window": group,
                        "name": w.window.name,
                        "index": w.window.index,
                        "basis": w.basis,
                        "start_ns": w.start_ns,
                        "end_ns": w.end_ns,
                        "span_ns": w.end_ns - w.start_ns,
                        "parts": per_window.get(a + i, []),
                    }
                )
            )
        for rank in ranks[g]:
            mine_windows = [w for w in clip.windows if w.window.rank == rank]
            if one_per_rank[g]:
                (i,) = [i for i, w in enumerate(clip.windows) if w.window.rank == rank]
                parts = per_window.get(a + i, [])
            else:
                parts = per_rank.get(rank_bucket[g][rank], [])
            result.groups.append(
                GroupAccount.model_validate(
                    {
                        "rank": rank,
                        "window": group,
                        "steps": steps.get((rank, group), len(mine_windows)),
                        "windows": len(mine_windows),
                        "span_ns": sum(w.end_ns - w.start_ns for w in mine_windows),
                        "parts": parts,
                    }
                )
            )


def _check_spans(windows: Sequence[TimelineWindow], parts: Mapping[int, list[PartDict]]) -> None:
    """Every window's account lines add up to its span (on the lines as published: they are
    the records' totals per line)."""
    for i, w in enumerate(windows):
        total = sum(int(p["time_ns"]) for p in parts.get(i, []))  # type: ignore[call-overload]
        if total != w.end_ns - w.start_ns:
            raise RuntimeError(
                f"account of {w.window.name!r} rank {w.window.rank}: parts add up to "
                f"{total} ns, span is {w.end_ns - w.start_ns} ns"
            )


@dataclass(frozen=True, slots=True)
class Pieces:
    """The raw pieces of some windows' accounts, for views that draw them (the export).

    Rows of ``seg``/``line``/``start``/``duration``/``thread``/``unit`` are pieces of time;
    ``unit < activities`` means the piece is an activity's share (``unit`` is its row in
    ``trace.activities``), otherwise it is an idle gap piece, exactly ``[start, start +
    duration)``. ``seg`` indexes ``windows``; ``line`` indexes ``lines``.
    """

    windows: list[TimelineWindow]
    lines: list[Line]
    activities: int
    seg: IntArray
    line: IntArray
    start: IntArray
    duration: IntArray
    thread: IntArray
    unit: IntArray
    clipped_row: IntArray
    clipped_start: IntArray
    clipped_end: IntArray
    """Every activity-window overlap the account saw: activity row, clipped start and end."""
    clipped_seg: IntArray


def account_pieces(
    trace: Trace,
    att: Attribution,
    ranges: RangeHelpers,
    catalog: Catalog,
    windows: Sequence[Window],
    selected: Sequence[int],
) -> Pieces:
    """The pieces of the windows ``selected`` (indices into ``windows``, of one group)."""
    gpu = window_timelines(trace, windows, gpu_activities(trace, att))
    return _pieces(_Context(trace, att, ranges, catalog, windows, gpu), selected)


def _keep(
    group_pass: _GroupPass, records: tuple[IntArray, ...], ids: IntArray, mine: list[int]
) -> _Kept:
    """The records and clipped rows of the group's windows ``mine`` (positions in the group;
    ``ids`` maps them to window indices)."""
    want = np.zeros(len(ids), dtype=bool)
    want[mine] = True
    at = want[records[0]]
    kept = tuple(column[at] for column in records)
    rows = want[group_pass.seg]
    clipped = (
        ids[group_pass.seg[rows]],
        group_pass.row[rows],
        group_pass.start[rows],
        group_pass.end[rows],
    )
    return _Kept(ids[mine], (ids[kept[0]], *kept[1:]), clipped)


def _kept_pieces(ctx: _Context, kept: Sequence[_Kept], selected: Sequence[int]) -> Pieces:
    """``Pieces`` of ``selected`` from the kept records: the same pieces a pass over those
    windows gives (every window's account depends on its own rows only; a group's rows are in
    (window, start) order either way), in group order."""
    position = {w: i for i, w in enumerate(selected)}
    where = np.full(len(ctx.gpu.windows), -1, dtype=np.int64)
    where[list(position)] = list(position.values())
    columns: list[list[IntArray]] = [[] for _ in range(6)]
    clipped: list[list[IntArray]] = [[] for _ in range(4)]
    for k in kept:
        at = where[k.records[0]] >= 0
        for bucket, column in zip(columns, k.records, strict=True):
            bucket.append(column[at])
        rows = where[k.clipped[0]] >= 0
        for bucket, column in zip(clipped, k.clipped, strict=True):
            bucket.append(column[rows])
    seg, code, dur, start, thread, unit = (np.concatenate(c) for c in columns)
    c_seg, c_row, c_start, c_end = (np.concatenate(c) for c in clipped)
    return Pieces(
        windows=[ctx.gpu.windows[i] for i in selected],
        lines=list(ctx.lines.lines),
        activities=len(ctx.att.helper),
        seg=where[seg],
        line=code,
        start=start,
        duration=dur,
        thread=ctx.thread_ids[thread],
        unit=unit,
        clipped_row=c_row,
        clipped_start=c_start,
        clipped_end=c_end,
        clipped_seg=where[c_seg],
    )


def _pieces(ctx: _Context, selected: Sequence[int]) -> Pieces:
    tw = [ctx.gpu.windows[i] for i in selected]
    clipped = clip_to_windows(tw, ctx.acts)
    group_pass = _GroupPass(ctx, tw, clipped, group_unions(ctx.acts, clipped)[0])
    seg, code, dur, start, thread, unit = group_pass.run().arrays()
    return Pieces(
        windows=tw,
        lines=list(ctx.lines.lines),
        activities=len(ctx.att.helper),
        seg=seg,
        line=code,
        start=start,
        duration=dur,
        thread=ctx.thread_ids[thread],
        unit=unit,
        clipped_row=group_pass.row,
        clipped_start=group_pass.start,
        clipped_end=group_pass.end,
        clipped_seg=group_pass.seg,
    )


__all__ = ["Accounts", "Pieces", "account_pieces", "compute_accounts"]
