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
from analyzers.syncs import HostSyncs, host_syncs
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
        windows: Sequence[Window],
        gpu: GpuTimeline,
        syncs: HostSyncs,
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
        self.host = HostStates(trace, ranges, names, syncs)
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
        self.unions = unions  # ``group_unions`` of ``clipped``: the timeline's definition
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
        local += base  # a fresh array of ``_dense``'s
        return local

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
        before_lo, before_hi, before_wait = comp.before_each(seg, lo, hi, wait_end)
        exposed = (hi - lo) - (before_hi - before_lo)
        waiting = (wait_end - lo) - (before_wait - before_lo)
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
        """Idle gaps by cause. At 2M kernels the gaps and their pieces are ~2M rows each and a
        fresh array costs about as much in page faults as the work on it, so the columns are
        computed in place wherever the input is not needed again."""
        ctx = self.ctx
        union = Union.of(self.seg, self.start, self.end, with_rows=True, in_order=True)
        gaps = union.gaps(self.win_start, self.win_end)
        n = len(gaps.start)
        if n == 0:
            return
        # The activity that ends the gap launched it; a trailing gap (no next piece: at most
        # one per window, so fixed up on its own) goes to the previous one's launching thread.
        has_next = gaps.next >= 0
        trailing = np.flatnonzero(~has_next)
        if len(union.start):
            owner = np.maximum(gaps.next, 0)
            np.take(union.first_row, owner, out=owner)
            np.take(self.row, owner, out=owner)
            before = gaps.prev[trailing]
            owner[trailing] = np.where(
                before >= 0, self.row[union.last_row[np.maximum(before, 0)]], -1
            )
        else:
            owner = np.full(n, -1, dtype=np.int64)
        code = ctx.l_tcode[owner]
        thread = ctx.thread_ids[code]  # a table of the few threads: no second large gather
        l_end = ctx.l_end[owner]
        # host-bound: the launching thread is known and had not returned from the launch when
        # the gap began (or the gap is a trailing one)
        host = l_end > gaps.start
        host[trailing] = True
        host &= thread >= 0
        other = np.flatnonzero(~host)
        gap_unit = len(ctx.att.helper)  # gaps are units numbered after the activity rows
        # 0: no work, 1: no launch row, 2: queued
        why = np.where(owner[other] < 0, 0, np.where(thread[other] < 0, 1, 2))
        del owner
        reasons = (NO_WORK, NO_LAUNCH, QUEUED)
        o_seg, o_start = gaps.seg[other], gaps.start[other]
        o_dur = gaps.end[other]
        o_dur -= o_start

        def reason(i: int) -> Line:
            return Line(AccountPartKind.IDLE_OTHER, reasons[why[i]])

        o_code = self._codes(why, o_seg, reason)
        o_thread = code[other]
        other += gap_unit
        self.records.add(o_seg, o_code, o_dur, o_start, o_thread, other)
        q = np.flatnonzero(host)
        del host
        q_end = gaps.end[q]
        cut = l_end[q]  # the launch's return, or the gap end if that comes first
        del l_end
        np.minimum(cut, q_end, out=cut)
        q_trailing = np.flatnonzero(~has_next[q])
        cut[q_trailing] = q_end[q_trailing]
        which, lo, hi, labels = ctx.host.split_labels(thread[q], gaps.start[q], cut, q_end)
        del cut, q_end
        gap = q[which]
        del q, which, thread
        g_seg = gaps.seg[gap]
        width = len(ctx.trace.strings) + len(ctx.att.helper_names) + 2
        # (type * width + value + 1) * (width + 1) + detail + 1, one array
        keys = labels.type * width
        keys += labels.value
        keys += 1
        keys *= width + 1
        keys += labels.detail
        keys += 1

        def make(i: int) -> Line:
            return self._host_line(int(labels.type[i]), int(labels.value[i]), int(labels.detail[i]))

        g_code = self._codes(keys, g_seg, make)
        del keys
        np.subtract(hi, lo, out=hi)
        g_thread = code[gap]
        gap += gap_unit
        self.records.add(g_seg, g_code, hi, lo, g_thread, gap)

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
    codes, distinct = _dense_distinct(values)
    return codes, len(distinct)


def _dense_distinct(values: IntArray) -> tuple[IntArray, IntArray]:
    """``_dense_small``'s codes and the distinct values they stand for (ascending)."""
    present = np.bincount(values) > 0
    table = np.cumsum(present) - 1
    return table[values].astype(np.int64, copy=False), np.flatnonzero(present)


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
    key, each line's total, distinct units, main thread and its ``largest[bucket]`` longest
    pieces.

    No sort of the records (at 2M kernels they are ~5M, and a sort plus the gathers in its
    order cost more than everything else here): every figure is a scatter (``np.add.at``,
    ``np.maximum.at``) or a count over the (bucket, line) keys, in record order.

    ``per_window``: the buckets are the windows, where an activity has at most one record per
    line (its share of one part in one window); else an activity clipped at a step boundary
    can have a record of one line in two windows of a rank, counted once."""
    seg, code, dur, start, thread, unit = records
    if len(dur) == 0:
        return {}
    # numpy's fast ``ufunc.at`` loops want the int64 dtype instance itself; arrays computed
    # from an unpickled trace (``read_kineto_files``' workers) carry an equal copy of it,
    # which takes the generic loop, ~25x slower: a view with the canonical one (no copy)
    dur = np.asarray(dur, dtype=np.int64)
    names = ctx.thread_labels
    n_threads = len(names)
    key = bucket * n_codes + code
    records_of = np.bincount(key)
    if n_threads * len(records_of) > 4 * len(key) + 1024:
        # few keys over a wide range: dense codes keep the tables per key small
        key, values = _dense_distinct(key)
        records_of = records_of[values]
    else:  # the keys themselves index the tables (no pass to recode the records)
        values = np.arange(len(records_of), dtype=np.int64)
    n_keys = len(values)
    # ``thread`` holds thread codes (``_Context.l_tcode``, in thread id order): the argmax
    # picks the thread with most time, ties the lowest id. An integer scatter-add is exact
    # and faster than a float ``bincount``; the totals are its row sums.
    flat = key * n_threads
    flat += thread
    per_thread = np.zeros(n_keys * n_threads, dtype=np.int64)
    np.add.at(per_thread, flat, dur)
    del flat
    units = _units(key, unit, records_of, len(ctx.att.helper), across_windows=not per_window)
    top = _largest(dur, key, n_keys, int(largest.max()))
    # from here on, only the keys that have records: the account lines
    lines_at = np.flatnonzero(records_of)
    key_bucket, key_code = np.divmod(values[lines_at], n_codes)
    per_thread = per_thread.reshape(-1, n_threads)[lines_at]
    totals = per_thread.sum(axis=1)
    main_thread = [names[t] for t in per_thread.argmax(axis=1).tolist()]
    units_of = units[lines_at].tolist()
    # the largest pieces of every line, line by line, longest first (-1: the line has fewer)
    top = top[:, lines_at].T
    have = (top >= 0) & (np.arange(top.shape[1]) < largest[key_bucket][:, None])
    rows = top[have]
    taken = have.sum(axis=1)
    end = np.cumsum(taken)
    first, last = (end - taken).tolist(), end.tolist()  # each line's evidence
    w_start = np.array([w.start_ns for w in windows], dtype=np.int64)
    w_name = [w.window.name for w in windows]
    w_index = [w.window.index for w in windows]
    starts = start[rows]
    evidence: list[PartDict] = [
        {
            "start_ns": a,
            "offset_ns": o,
            "duration_ns": du,
            "window": w_name[g],
            "index": w_index[g],
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
    # each bucket's lines by (part, longest first, label), ties in key order: one stable
    # lexsort of the keys instead of a Python sort per bucket
    lines = ctx.lines.lines
    labels = sorted({line.label for line in lines})
    label_rank = {label: i for i, label in enumerate(labels)}
    code_part = np.array([_PART_RANK[line.part] for line in lines], dtype=np.int64)
    code_label = np.array([label_rank[line.label] for line in lines], dtype=np.int64)
    order = np.lexsort((code_label[key_code], -totals, code_part[key_code], key_bucket))
    out: dict[int, list[PartDict]] = {}
    time_ns, buckets, codes = totals.tolist(), key_bucket.tolist(), key_code.tolist()
    for i in order.tolist():
        line = lines[codes[i]]
        out.setdefault(buckets[i], []).append(
            {
                "part": line.part,
                "label": line.label,
                "category": line.category,
                "time_ns": time_ns[i],
                "gaps": units_of[i],
                "largest": evidence[first[i] : last[i]],
                "thread": main_thread[i],
                "detail": line.detail,
            }
        )
    return out


def _units(
    key: IntArray,
    unit: IntArray,
    records_of: IntArray,
    activities: int,
    across_windows: bool,
) -> IntArray:
    """Per key, its distinct units (``unit < activities``: an activity row, else a gap): its
    records (``records_of``) less the repeats of a (key, unit) pair, counted by sorting only
    the records that can repeat one.

    Those are the pieces of gaps cut into several (a gap's pieces are consecutive records:
    ``_GroupPass._idle`` adds them together; a gap can go A, B, A, so not only neighbours
    repeat) and, ``across_windows``, the activities with several records (one record per
    line in a window, but an activity clipped at a step boundary has one in each window of
    its rank). At 2M kernels that is 15% of the records, not all of them."""
    n_keys = len(records_of)
    counts = records_of.copy()
    later = np.flatnonzero(unit[1:] == unit[:-1]) + 1  # a piece after another of its unit
    later = later[unit[later] >= activities]
    maybe = [later, later[np.diff(later, prepend=-2) != 1] - 1]  # and the first of each run
    if across_windows:
        act = np.flatnonzero(unit < activities)
        row = unit[act]
        maybe.append(act[np.bincount(row)[row] > 1])
    at = np.concatenate(maybe)
    # stable (timsort): the pairs come in runs of ascending units, which it merges fast
    pairs = np.sort(unit[at] * n_keys + key[at], kind="stable")
    counts -= np.bincount(pairs[1:][pairs[1:] == pairs[:-1]] % n_keys, minlength=n_keys)
    return counts


LARGEST_SAMPLE = 32
"""``_largest`` first ranks every 32nd record: its pick bounds the full one from below."""


def _largest(d: IntArray, key: IntArray, n_keys: int, count: int) -> IntArray:
    """Record indices of the ``count`` longest records of each key, one row per rank
    (longest first), -1 where a key has fewer; ties: the earliest record.

    Repeated per-key maxima (``np.maximum.at``) of ``duration * n - position``: the position
    rides in the low digits, so the maximum names its record (ties: the earliest); no sort.
    Each round is a pass over all records, so on many records only the candidates take part:
    the records at least as long as the ``count``-th longest of the key's records in a
    sample of every ``LARGEST_SAMPLE``-th record (the sample's ``count`` are as long).
    """
    n = len(d)
    out = np.full((count, n_keys), -1, dtype=np.int64)
    if n == 0 or count == 0:
        return out
    if n > 64 * LARGEST_SAMPLE:
        sample_d = np.ascontiguousarray(d[::LARGEST_SAMPLE])
        kth = _largest(sample_d, np.ascontiguousarray(key[::LARGEST_SAMPLE]), n_keys, count)[-1]
        bound = np.where(kth >= 0, sample_d[kth], np.iinfo(np.int64).min)
        candidates = np.flatnonzero(d >= bound[key])
        if len(candidates) < n // 2:
            picked = _largest(d[candidates], key[candidates], n_keys, count)
            return np.where(picked >= 0, candidates[picked], -1)
    if int(d.max()) * n >= (1 << 62):  # too wide to encode: sort instead
        by = np.lexsort((-d, key))  # stable: ties in record order
        k = key[by]
        head = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
        ends = np.append(head[1:], n)
        for j in range(count):
            pos = head + j
            out[j, k[head]] = np.where(pos < ends, by[np.minimum(pos, n - 1)], -1)
        return out
    enc = d * n
    enc -= np.arange(n, dtype=np.int64)
    gone = np.iinfo(np.int64).min
    for j in range(count):
        best = np.full(n_keys, gone, dtype=np.int64)
        np.maximum.at(best, key, enc)
        hit = np.flatnonzero(best > gone)
        pos = -best[hit] % n
        out[j, hit] = pos
        enc[pos] = gone
    return out


def compute_accounts(
    trace: Trace,
    att: Attribution,
    ranges: RangeHelpers,
    catalog: Catalog,
    windows: Sequence[Window],
    steps: Mapping[tuple[int, str], int],
    gpu: GpuTimeline,
    keep: Collection[int] = (),
    syncs: HostSyncs | None = None,
) -> Accounts:
    """The account of every window of ``windows`` and of every (rank, window group), over the
    windows and clipped activities of their GPU timeline ``gpu`` (``Metrics.gpu``). ``keep``:
    windows (indices into ``windows``) whose pieces ``Accounts.pieces`` will be asked for (the
    run page's drawn steps), kept from the group passes instead of computed again. ``syncs``:
    the trace's blocking calls (``Metrics.syncs``), found here when not given.

    :raises RuntimeError: when a window's parts do not add up to its span (a bug, never input).
    """
    found = syncs if syncs is not None else host_syncs(trace, catalog, att)
    ctx = _Context(trace, att, ranges, windows, gpu, found)
    result = Accounts(notes=list(ctx.peers.notes), context=ctx)
    wanted = set(keep)
    for batch in _batches(list(gpu.groups.items())):
        _account_batch(ctx, result, batch, steps, wanted)
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
    group_pass = _GroupPass(ctx, tw, clipped, group_unions(ctx.acts, clipped), group_of)
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
    syncs = host_syncs(trace, catalog, att)
    return _pieces(_Context(trace, att, ranges, windows, gpu, syncs), selected)


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
    group_pass = _GroupPass(ctx, tw, clipped, group_unions(ctx.acts, clipped))
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
