"""Something to say about any trace: what ran, where the host time went, what to do first.

Whole trace, all ranks, totals (the one per-step figure: a host sync's estimated saving): the
summary needs no manifest, no TE and no catalog entry of the user's own code, so a plain
training script gets it too.

* ``families``: GPU activity time by library family (GEMM, attention, communication, ...) and
  the catalog entry that claimed it (``gemm``, ``flash_attn_fwd``, ``nccl_all_reduce``).
* ``cpu_ops``: the CPU operators (Kineto ``cpu_op``: ``aten::*``) with the most self time
  (duration minus the ranges directly inside).
* ``ranges``: the NVTX / ``record_function`` ranges no catalog entry names, with calls,
  inclusive and self time: the user's own annotations.
* ``sync_pointers``: where the host may block on the GPU (host-sync operators, blocking CUDA
  calls outside them), by the innermost Python frame outside torch and installed libraries
  (Kineto ``with_stack``), with the blocking CUDA calls made there, the GPU idle that followed
  them and, per step, the saving estimated from it. Kineto names a frame by its def line; where
  the profiled process recorded the line of each synchronizing CUDA call (the manifest's
  ``sync_lines``), a pointer that blocked names that line instead.
* ``do_first``: at most three actions, from the findings (errors and warnings, the largest
  saving first), then the sync pointers whose syncs inside the steps cost GPU time.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analyzers.attribution import Attribution, RangeHelpers, RangeIndex
from analyzers.catalog import Catalog
from analyzers.manifest import SyncCallSite, SyncLines
from analyzers.model import ActivityKind, RangeKind, Trace
from analyzers.report import (
    Action,
    Category,
    FamilyRow,
    Finding,
    KernelFamily,
    OpRow,
    Severity,
    SyncPointer,
    TraceSummary,
    Window,
)
from analyzers.sweep import Union
from analyzers.syncs import HostSyncs
from analyzers.timeline import GpuActivities
from contracts.frames import LIBRARY_FRAME, PROFILE_HOOK_FRAME, same_file

IntArray = npt.NDArray[np.int64]

TOP_ROWS = 10
"""Rows kept per table."""
DO_FIRST = 3
"""Actions in "do this first"."""
_OPTIMIZER_WORDS = ("multi_tensor_apply", "adam", "sgd", "lamb_", "optimizer", "_foreach_")
_ELEMENTWISE_WORDS = ("elementwise", "reduce_kernel", "unrolled_", "vectorized_", "at::native::")
_OPTIMIZER = re.compile("(?i)" + "|".join(map(re.escape, _OPTIMIZER_WORDS)))
_ELEMENTWISE = re.compile("(?i)" + "|".join(map(re.escape, _ELEMENTWISE_WORDS)))
_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<function>.*)$")
_FAMILY_OF_HELPER = {
    "gemm": KernelFamily.GEMM,
    "cudnn_convolution": KernelFamily.CONVOLUTION,
    "cudnn_batch_norm": KernelFamily.CONVOLUTION,
    "fbgemm_embedding": KernelFamily.EMBEDDING,
    "fbgemm_quantize": KernelFamily.EMBEDDING,
    "fbgemm_other": KernelFamily.EMBEDDING,
}


def summarize(
    trace: Trace,
    att: Attribution,
    ranges: RangeHelpers,
    catalog: Catalog,
    findings: Sequence[Finding],
    *,
    syncs: HostSyncs | None = None,
    acts: GpuActivities | None = None,
    windows: Sequence[Window] = (),
    sync_lines: Sequence[SyncLines] = (),
) -> TraceSummary:
    """The summary of ``trace`` (see the module docstring). ``syncs``, ``acts`` and ``windows``
    (the metrics' blocking calls, GPU activities and windows) give the sync pointers their
    blocking calls and saving; without them a pointer counts operator calls only.
    ``sync_lines`` (the manifest's) give a pointer that blocked the line of its call."""
    families = _families(trace, att)
    pointers = _sync_pointers(trace, catalog, syncs, acts, windows)
    sites = [site for rank in sync_lines for site in rank.sites]
    if sites:
        pointers = [_at_recorded_line(p, sites) for p in pointers]
    return TraceSummary(
        families=families,
        cpu_ops=_top(trace, trace.ranges["kind"] == RangeKind.CPU_OP, by_self=True),
        ranges=_top(trace, _uncatalogued(trace, ranges), by_self=False),
        communication_share=_communication_share(trace, families),
        sync_pointers=pointers,
        do_first=do_first(findings, pointers, gpu=len(trace.activities) > 0),
    )


def _holds(name: str, lower: str | None, words: tuple[str, ...], regex: re.Pattern[str]) -> bool:
    """Whether ``name`` holds one of ``words`` in any case: substring searches on an ASCII name
    (``lower`` is its lower case), the case-insensitive ``regex`` of the words otherwise (where
    Unicode case folding differs from ``str.lower``)."""
    if lower is not None:
        return any(word in lower for word in words)
    return regex.search(name) is not None


def _name_family(name: str) -> KernelFamily:
    """The family a kernel's name alone implies (communication, optimizer, elementwise)."""
    lower = name.lower()
    if "nccl" in lower:
        return KernelFamily.COMMUNICATION
    ascii_lower = lower if name.isascii() else None
    if _holds(name, ascii_lower, _OPTIMIZER_WORDS, _OPTIMIZER):
        return KernelFamily.OPTIMIZER
    if _holds(name, ascii_lower, _ELEMENTWISE_WORDS, _ELEMENTWISE):
        return KernelFamily.ELEMENTWISE
    return KernelFamily.OTHER


def _family(kind: int, helper: str, category: Category | None) -> KernelFamily | None:
    """The family an activity's kind and helper imply; None: its name decides."""
    if kind != ActivityKind.KERNEL:
        return KernelFamily.MEMORY
    if helper in _FAMILY_OF_HELPER:
        return _FAMILY_OF_HELPER[helper]
    if category is Category.ATTENTION:
        return KernelFamily.ATTENTION
    if category is Category.COMMUNICATION:
        return KernelFamily.COMMUNICATION
    return None


def _families(trace: Trace, att: Attribution) -> list[FamilyRow]:
    """Per (family, library): activities and summed time; one pass per distinct
    (kind, helper, name), not per activity."""
    acts = trace.activities
    if len(acts) == 0:
        return []
    n_names = max(len(trace.strings), 1)
    key = acts["kind"].astype(np.int64) * (len(att.helper_names) + 1) + att.helper + 1
    key = key * n_names + acts["name"]
    unique, inverse = np.unique(key, return_inverse=True)
    durations = (acts["end"] - acts["start"]).astype(np.int64)
    time = np.bincount(inverse, weights=durations, minlength=len(unique))
    count = np.bincount(inverse, minlength=len(unique))
    rows: dict[tuple[KernelFamily, str], list[int]] = {}
    name_families: dict[int, KernelFamily] = {}

    def by_name(symbol: int) -> KernelFamily:  # once per distinct name, and only when needed
        if symbol not in name_families:
            name_families[symbol] = _name_family(trace.strings[symbol])
        return name_families[symbol]

    for k, ns, n in zip(unique.tolist(), time.tolist(), count.tolist(), strict=True):
        name, rest = k % n_names, k // n_names
        helper, kind = rest % (len(att.helper_names) + 1) - 1, rest // (len(att.helper_names) + 1)
        label = att.name_of(helper)
        category = att.category_of(helper) if helper >= 0 else None
        family = _family(kind, label, category)
        if family is None:
            family = by_name(name)
        row = rows.setdefault((family, label), [0, 0])
        row[0] += n
        row[1] += int(ns)
    total = sum(ns for _, ns in rows.values()) or 1
    out = [
        FamilyRow(family=f, library=lib, activities=n, gpu_time_ns=ns, share=round(ns / total, 4))
        for (f, lib), (n, ns) in rows.items()
    ]
    return sorted(out, key=lambda r: (-r.gpu_time_ns, r.library))[: 2 * TOP_ROWS]


ROW_BLOCK = 1 << 18
"""Range rows ``_top`` reads at a time: its per-row temporaries (names, durations, self times,
a sort of the names: about ten int64 a row at once) grew with the run, the merge's peak over
many ranks."""


def _self_time(trace: Trace) -> npt.NDArray[np.int64]:
    """Per range row: duration minus the durations of the ranges directly inside it."""
    table = trace.ranges
    duration = (table["end"] - table["start"]).astype(np.int64)
    out: npt.NDArray[np.int64] = np.maximum(duration - _inner_time(trace), 0)
    return out


def _inner_time(trace: Trace, block: int = ROW_BLOCK) -> npt.NDArray[np.int64]:
    """Per range row: the summed durations of the ranges directly inside it (children are
    added in row order, block by block: integer sums, the same in any order)."""
    table = trace.ranges
    inner = np.zeros(len(table), dtype=np.int64)
    for lo in range(0, len(table), block):
        part = table[lo : lo + block]
        child = np.flatnonzero(part["parent"] >= 0)
        np.add.at(inner, part["parent"][child], (part["end"][child] - part["start"][child]))
    return inner


def _top(
    trace: Trace, mask: npt.NDArray[np.bool_], *, by_self: bool, block: int = ROW_BLOCK
) -> list[OpRow]:
    """The ``TOP_ROWS`` names of the ranges ``mask`` holds with the most self (or inclusive)
    time. The sums are taken in row order, block by block (``np.add.at`` adds in the order
    ``np.bincount`` does, so the float sums are the same whatever the blocks)."""
    table = trace.ranges
    n_names = max(len(trace.strings), 1)
    inclusive = np.zeros(n_names, dtype=np.float64)
    self_ns = np.zeros(n_names, dtype=np.float64)
    calls = np.zeros(n_names, dtype=np.int64)
    inner = _inner_time(trace, block)
    for lo in range(0, len(table), block):
        here = slice(lo, lo + block)
        rows = np.flatnonzero(mask[here])
        if len(rows) == 0:
            continue
        part = table[here][rows]
        names = part["name"].astype(np.int64)
        duration = (part["end"] - part["start"]).astype(np.int64)
        own = np.maximum(duration - inner[here][rows], 0)
        np.add.at(inclusive, names, duration.astype(np.float64))
        np.add.at(self_ns, names, own.astype(np.float64))
        calls += np.bincount(names, minlength=n_names)
    unique = np.flatnonzero(calls)
    if len(unique) == 0:
        return []
    inclusive, self_ns, calls = inclusive[unique], self_ns[unique], calls[unique]
    order = np.argsort(-(self_ns if by_self else inclusive), kind="stable")[:TOP_ROWS]
    return [
        OpRow(
            name=trace.strings[int(unique[i])],
            calls=int(calls[i]),
            inclusive_ns=int(inclusive[i]),
            self_ns=int(self_ns[i]),
        )
        for i in order.tolist()
    ]


def _uncatalogued(trace: Trace, ranges: RangeHelpers) -> npt.NDArray[np.bool_]:
    kinds = np.array([RangeKind.NVTX, RangeKind.RECORD_FUNCTION], dtype=np.int8)
    mask: npt.NDArray[np.bool_] = np.isin(trace.ranges["kind"], kinds) & (ranges.helper < 0)
    return mask


def _communication_share(trace: Trace, families: Sequence[FamilyRow]) -> float | None:
    """Communication's share of GPU time; without GPU activity, gloo's (and any
    collective's) share of the CPU operators' self time."""
    if families:
        total = sum(r.gpu_time_ns for r in families) or 1
        comm = sum(r.gpu_time_ns for r in families if r.family is KernelFamily.COMMUNICATION)
        return round(comm / total, 4)
    kinds = [RangeKind.CPU_OP, RangeKind.RECORD_FUNCTION]
    ops = np.flatnonzero(np.isin(trace.ranges["kind"], kinds))
    if len(ops) == 0:
        return None
    own = _self_time(trace)[ops]
    names = trace.ranges["name"][ops]
    present = np.unique(names).tolist()
    collective = {s for s in present if _is_collective(trace.strings[s])}
    total = int(own.sum()) or 1
    comm = int(own[np.isin(names, list(collective))].sum()) if collective else 0
    return round(comm / total, 4)


def _is_collective(name: str) -> bool:
    lowered = name.lower()
    return lowered.startswith(("gloo:", "nccl:", "c10d::")) or "all_reduce" in lowered


@dataclass(frozen=True, slots=True)
class _Sites:
    """Where a thread may have blocked on the GPU, one row per site: an outermost host-sync
    operator call, or a blocking CUDA call made outside any (``torch.cuda.synchronize()``)."""

    thread: IntArray
    start: IntArray
    rank: IntArray
    label: IntArray  # the symbol naming it: the operator, else the call's API
    blocking: IntArray  # blocking CUDA calls inside it (0: it waited for nothing)
    released: IntArray  # when it stopped blocking: its end, or its last blocking call's end


def _sites(trace: Trace, catalog: Catalog, syncs: HostSyncs | None) -> _Sites:
    table = trace.ranges
    names = table["name"]
    sync = [s for s in np.unique(names).tolist() if catalog.is_sync("ops", trace.strings[s])]
    is_sync = np.isin(names, sync) & (table["kind"] == RangeKind.CPU_OP)
    # the outermost sync op only: ``aten::item`` calls ``aten::_local_scalar_dense``
    parent = table["parent"]
    nested = np.zeros(len(table), dtype=bool)
    inside = np.flatnonzero(is_sync & (parent >= 0))
    nested[inside] = is_sync[parent[inside]]
    ops = np.flatnonzero(is_sync & ~nested)
    o = table[ops]
    thread, start = o["thread"].astype(np.int64), o["start"].astype(np.int64)
    rank, label = o["rank"].astype(np.int64), o["name"].astype(np.int64)
    released = o["end"].astype(np.int64)
    blocking = np.zeros(len(ops), dtype=np.int64)
    if syncs is not None and len(syncs.calls):
        calls = syncs.calls
        c = trace.launches[calls]
        c_thread, c_start = c["thread"].astype(np.int64), c["start"].astype(np.int64)
        index = RangeIndex(thread, start, released, np.arange(len(ops), dtype=np.int64))
        op = index.lookup(c_thread, c_start) if len(ops) else np.full(len(calls), -1)
        held = op >= 0
        np.add.at(blocking, op[held], 1)
        np.maximum.at(released, op[held], syncs.end[held])
        free = ~held  # a blocking call outside every sync op is a site of its own
        thread = np.concatenate([thread, c_thread[free]])
        start = np.concatenate([start, c_start[free]])
        rank = np.concatenate([rank, c["rank"][free].astype(np.int64)])
        label = np.concatenate([label, syncs.label[free]])
        blocking = np.concatenate([blocking, np.ones(int(free.sum()), dtype=np.int64)])
        released = np.concatenate([released, syncs.end[free]])
    return _Sites(thread, start, rank, label, blocking, released)


def _gpu_idle_after(sites: _Sites, acts: GpuActivities | None) -> IntArray:
    """Per site that blocked: the GPU idle time of its rank from the site's start until the
    first GPU activity that starts once the site released the thread (the queue the sync
    drained is empty until the host launches again); 0 for a site that waited for nothing."""
    idle = np.zeros(len(sites.start), dtype=np.int64)
    blocked = np.flatnonzero((sites.blocking > 0) & (sites.rank >= 0))
    if acts is None or len(acts.start) == 0 or len(blocked) == 0:
        return idle
    known = np.flatnonzero(acts.rank >= 0)  # an activity no launch placed on a rank: none
    order = known[np.lexsort((acts.start[known], acts.rank[known]))]
    a_rank, a_start = acts.rank[order], acts.start[order]
    busy = Union.of(a_rank, a_start, acts.end[order], in_order=True)
    for r in np.unique(sites.rank[blocked]).tolist():
        mine = blocked[sites.rank[blocked] == r]
        lo_r, hi_r = np.searchsorted(a_rank, [r, r + 1])
        starts = a_start[lo_r:hi_r]
        released = sites.released[mine]
        at = np.searchsorted(starts, released, side="left")
        refill = np.where(at < len(starts), starts[np.minimum(at, len(starts) - 1)], released)
        lo = np.minimum(sites.start[mine], refill)
        seg = np.full(len(mine), r, dtype=np.int64)
        idle[mine] = (refill - lo) - busy.covered(seg, lo, refill)
    return idle


def _steps_of(sites: _Sites, windows: Sequence[Window]) -> IntArray:
    """Per site: the number of steps of its rank when the site lies inside one of them (a
    ``step`` window, by its start), else 0 (between steps; a trace without steps)."""
    out = np.zeros(len(sites.start), dtype=np.int64)
    for r in np.unique(sites.rank).tolist():
        steps = sorted((w.start_ns, w.end_ns) for w in windows if w.kind == "step" and w.rank == r)
        if not steps:
            continue
        lo, hi = np.array(steps, dtype=np.int64).T
        reach = np.maximum.accumulate(hi)  # overlapping steps: any earlier one may hold it
        mine = np.flatnonzero(sites.rank == r)
        at = np.searchsorted(lo, sites.start[mine], side="right") - 1
        inside = (at >= 0) & (sites.start[mine] < reach[np.maximum(at, 0)])
        out[mine[inside]] = len(steps)
    return out


def _sync_pointers(
    trace: Trace,
    catalog: Catalog,
    syncs: HostSyncs | None = None,
    acts: GpuActivities | None = None,
    windows: Sequence[Window] = (),
) -> list[SyncPointer]:
    """Innermost user Python frame around each sync site, counted per frame and op, with the
    GPU idle the blocking ones were followed by (``_gpu_idle_after``) and, per step, the
    saving estimated from it (the largest rank's). A site under one of cptrace's profile hooks
    called from that frame (the PyTorch profiler synchronizing when it stops tracing) is
    cptrace's, not the job's: no pointer."""
    table = trace.ranges
    names = table["name"]
    python = table["kind"] == RangeKind.PYTHON
    framed_names = [s for s in np.unique(names).tolist() if _FRAME.match(trace.strings[s])]
    hook = [s for s in framed_names if PROFILE_HOOK_FRAME.search(trace.strings[s])]
    user = [s for s in framed_names if s not in hook and not LIBRARY_FRAME.search(trace.strings[s])]
    frames = np.flatnonzero(np.isin(names, user) & python)
    sites = _sites(trace, catalog, syncs)
    if len(sites.start) == 0 or len(frames) == 0:
        return []
    index = RangeIndex(
        table["thread"][frames], table["start"][frames], table["end"][frames], frames
    )
    found = index.lookup(sites.thread, sites.start)
    placed = found >= 0
    hooks = np.flatnonzero(np.isin(names, hook) & python)
    if len(hooks) and placed.any():
        inner = RangeIndex(
            table["thread"][hooks], table["start"][hooks], table["end"][hooks], hooks
        ).lookup(sites.thread, sites.start)
        # a hook inside the user's frame (not one around it: ``--step-function``'s wrapper)
        placed &= ~((inner >= 0) & (table["start"][inner] >= table["start"][found]))
    framed = np.flatnonzero(placed)
    if len(framed) == 0:
        return []
    idle = _gpu_idle_after(sites, acts)[framed]
    steps = _steps_of(sites, windows)[framed]
    rank = sites.rank[framed]
    # one group per (frame symbol, site label): counts by bincount, not per site
    width = len(trace.strings) + 1
    key = names[found[framed]].astype(np.int64) * width + sites.label[framed]
    groups, group = np.unique(key, return_inverse=True)
    n = len(groups)
    calls = np.bincount(group, minlength=n)
    in_steps = np.bincount(group, weights=steps > 0, minlength=n)
    blocking = np.bincount(group, weights=sites.blocking[framed], minlength=n)
    idle_ns = np.bincount(group, weights=idle, minlength=n)
    # per step and rank: the idle after a group's sites inside the steps / the rank's steps
    stepped = np.flatnonzero(steps > 0)
    saving = np.full(n, -1.0)  # -1: no site of the group inside a step
    if len(stepped):
        pairs, pair = np.unique(
            np.stack([group[stepped], rank[stepped]], axis=1), axis=0, return_inverse=True
        )
        share = np.bincount(pair.ravel(), weights=idle[stepped] / steps[stepped])
        np.maximum.at(saving, pairs[:, 0], share)
    gpu = acts is not None and len(acts.start) > 0
    out = [
        SyncPointer(
            frame=_frame_text(trace.strings[int(k // width)]),
            op=trace.strings[int(k % width)],
            calls=int(calls[g]),
            step_calls=int(in_steps[g]),
            blocking_calls=int(blocking[g]) if gpu else None,
            gpu_idle_ns=int(idle_ns[g]) if gpu else None,
            saving_ms=round(float(saving[g]) / 1e6, 4) if gpu and saving[g] >= 0 else None,
        )
        for g, k in enumerate(groups.tolist())
    ]
    out.sort(key=lambda p: (-(p.gpu_idle_ns or 0), -p.calls, p.frame, p.op))
    return out[:TOP_ROWS]


def _frame_text(name: str) -> str:
    """``train.py(50): zero_tail`` -> ``train.py:50 in zero_tail``."""
    m = _FRAME.match(name)
    return f"{m['file']}:{m['line']} in {m['function']}" if m else name


_POINTER_FRAME = re.compile(r"^(?P<file>.*):(?P<line>\d+) in (?P<function>.*)$")


def recorded_lines(frame: str, sites: Sequence[SyncCallSite]) -> list[int]:
    """The recorded lines of the synchronizing calls in the function a pointer's ``frame``
    (``train.py:6 in check_finite``, Kineto's line) names, most calls first: the sites of the
    same file and function whose function starts at that line, or, for a frame Kineto named by
    the line running when profiling started, at the nearest first line above it (two functions
    of one name in one file start at different lines). None recorded: ``[]``."""
    m = _POINTER_FRAME.match(frame)
    if m is None:
        return []
    file, line, function = m["file"], int(m["line"]), m["function"]
    mine = [
        s
        for s in sites
        if s.function == function and s.first_line <= line and same_file(file, s.file)
    ]
    if not mine:
        return []
    first = max(s.first_line for s in mine)
    counts: Counter[int] = Counter()
    for s in mine:
        if s.first_line == first:
            counts[s.line] += s.count
    return [n for n, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def _at_recorded_line(pointer: SyncPointer, sites: Sequence[SyncCallSite]) -> SyncPointer:
    """``pointer`` at the recorded line of its call, when it blocked (a sync that waited for
    nothing made no CUDA call, so no record is its) and one was recorded in its function."""
    if not pointer.blocking_calls:
        return pointer
    lines = recorded_lines(pointer.frame, sites)
    m = _POINTER_FRAME.match(pointer.frame)
    if not lines or m is None:
        return pointer
    frame = f"{m['file']}:{','.join(map(str, lines))} in {m['function']}"
    return pointer.model_copy(update={"frame": frame, "call_lines": lines})


def do_first(
    findings: Sequence[Finding], pointers: Sequence[SyncPointer], *, gpu: bool = True
) -> list[Action]:
    """At most ``DO_FIRST`` actions: errors and warnings with their saving, largest first
    (unquantified ones after), then the host-sync pointers that blocked, largest saving
    first."""
    urgent = [f for f in findings if f.severity in (Severity.ERROR, Severity.WARNING)]
    urgent.sort(
        key=lambda f: (
            f.severity is not Severity.ERROR,
            f.expected_saving_ms is None,
            -(f.expected_saving_ms or 0.0),
        )
    )
    seen: set[tuple[str, str | None]] = set()
    out = []
    for f in urgent:
        if (f.rule, f.helper) in seen:
            continue  # the same fix for several windows: once, its largest saving
        seen.add((f.rule, f.helper))
        out.append(
            Action(
                action=_first_sentence(f.recommendation),
                saving_ms=f.expected_saving_ms,
                saving_basis=f.saving_basis,
                evidence=f.title + (f" ({f.window})" if f.window else ""),
                rule=f.rule,
            )
        )
    out += _sync_actions(pointers, gpu=gpu)
    return out[:DO_FIRST]


SAVING_METHOD = (
    "saving estimated as the GPU idle from each blocking call inside a step until the GPU's "
    "next activity after it, per step"
)
"""How a host-sync action's saving was estimated (its evidence says it)."""
LINE_CAVEAT = (
    "Kineto names a frame by its def line (or the line running when profiling started), not "
    "the line of the call"
)
"""Why a pointer's line may not be the line of the sync: a Kineto ``python_function`` event
holds the line of its own frame when the tracer first saw it, and no event holds the caller's
current line (``docs/analyzers.md``, summary)."""
RECORDED_LINE = (
    "the line of the call as the profiled process recorded it (CUDA sync debug mode 'warn', "
    "cptrace profile --torch)"
)
"""Where a pointer's line came from when the bundle's manifest holds ``sync_lines``."""


def _sync_actions(pointers: Sequence[SyncPointer], *, gpu: bool) -> list[Action]:
    """One action per frame with syncs inside the steps that cost GPU time (on a trace without
    GPU: that called host-sync operators in the steps, their wait not observed), the largest
    saving first. A sync between steps, or one that waited for nothing (``.item()`` of a CPU
    tensor), is no action."""
    by_frame: dict[str, list[SyncPointer]] = {}
    for p in pointers:
        costs = p.step_calls > 0 and (not gpu or (p.saving_ms or 0.0) > 0)
        if costs:
            by_frame.setdefault(p.frame, []).append(p)
    actions = []
    for frame, mine in by_frame.items():
        ops = ", ".join(p.op for p in mine)
        calls = sum(p.step_calls for p in mine)
        if gpu:
            blocking = sum(p.blocking_calls or 0 for p in mine)
            why = (
                f"{blocking} blocking CUDA call(s) from {sum(p.calls for p in mine)} host-sync "
                f"call(s) there; {SAVING_METHOD}"
            )
        else:
            why = (
                f"{calls} host-sync call(s) there in the steps: on a GPU tensor each would wait "
                "for the device (this run had no GPU activity)"
            )
        saving = sum(p.saving_ms or 0.0 for p in mine) if gpu else None
        line = RECORDED_LINE if all(p.call_lines for p in mine) else LINE_CAVEAT
        actions.append(
            Action(
                action=f"Take the host sync ({ops}) at {frame} out of the step, or compute the "
                "value on the host",
                saving_ms=round(saving, 4) if saving is not None else None,
                saving_basis="estimate" if saving is not None else None,
                evidence=f"{why}; {line}",
                rule="host-sync-in-step",
            )
        )
    actions.sort(key=lambda a: -(a.saving_ms or 0.0))
    return actions


def _first_sentence(text: str) -> str:
    cut = re.search(r"(?<=[a-z0-9)\]])\.\s", text)
    return text[: cut.start() + 1] if cut else text


__all__ = [
    "DO_FIRST",
    "LINE_CAVEAT",
    "RECORDED_LINE",
    "SAVING_METHOD",
    "TOP_ROWS",
    "do_first",
    "recorded_lines",
    "summarize",
]
