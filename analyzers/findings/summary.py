"""Something to say about any trace: what ran, where the host time went, what to do first.

Whole trace, all ranks, totals (never "per step"): the summary needs no manifest, no TE and no
catalog entry of the user's own code, so a plain training script gets it too.

* ``families``: GPU activity time by library family (GEMM, attention, communication, ...) and
  the catalog entry that claimed it (``gemm``, ``flash_attn_fwd``, ``nccl_all_reduce``).
* ``cpu_ops``: the CPU operators (Kineto ``cpu_op``: ``aten::*``) with the most self time
  (duration minus the ranges directly inside).
* ``ranges``: the NVTX / ``record_function`` ranges no catalog entry names, with calls,
  inclusive and self time: the user's own annotations.
* ``sync_pointers``: where the host blocked on the GPU, by the innermost Python frame outside
  torch and installed libraries (traces with stacks: Kineto ``with_stack``, nsys
  ``--python-functions-trace``).
* ``do_first``: at most three actions, the largest saving first, from the findings (errors and
  warnings) and, failing those, the sync pointers.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from analyzers.attribution import Attribution, RangeHelpers, RangeIndex
from analyzers.catalog import Catalog
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
)

TOP_ROWS = 10
"""Rows kept per table."""
DO_FIRST = 3
"""Actions in "do this first"."""
_OPTIMIZER = re.compile(r"(?i)multi_tensor_apply|adam|sgd|lamb_|optimizer|_foreach_")
_ELEMENTWISE = re.compile(r"(?i)elementwise|reduce_kernel|unrolled_|vectorized_|at::native::")
_LIBRARY_FRAME = re.compile(r"site-packages|dist-packages|/torch/|^<built-in|^torch/|^<frozen")
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
) -> TraceSummary:
    """The summary of ``trace`` (see the module docstring)."""
    families = _families(trace, att)
    pointers = _sync_pointers(trace, catalog)
    return TraceSummary(
        families=families,
        cpu_ops=_top(trace, trace.ranges["kind"] == RangeKind.CPU_OP, by_self=True),
        ranges=_top(trace, _uncatalogued(trace, ranges), by_self=False),
        communication_share=_communication_share(trace, families),
        sync_pointers=pointers,
        do_first=do_first(findings, pointers, gpu=len(trace.activities) > 0),
    )


def _family(kind: int, helper: str, category: Category | None, name: str) -> KernelFamily:
    if kind != ActivityKind.KERNEL:
        return KernelFamily.MEMORY
    if helper in _FAMILY_OF_HELPER:
        return _FAMILY_OF_HELPER[helper]
    if category is Category.ATTENTION:
        return KernelFamily.ATTENTION
    if category is Category.COMMUNICATION or "nccl" in name.lower():
        return KernelFamily.COMMUNICATION
    if _OPTIMIZER.search(name):
        return KernelFamily.OPTIMIZER
    if _ELEMENTWISE.search(name):
        return KernelFamily.ELEMENTWISE
    return KernelFamily.OTHER


def _families(trace: Trace, att: Attribution) -> list[FamilyRow]:
    """Per (family, library): activities and summed time; one pass per distinct
    (kind, helper, name), not per activity."""
    acts = trace.activities
    if len(acts) == 0:
        return []
    n_names = max(len(trace.strings), 1)
    key = (acts["kind"].astype(np.int64) * (len(att.helper_names) + 1) + att.helper + 1)
    key = key * n_names + acts["name"]
    unique, inverse = np.unique(key, return_inverse=True)
    durations = (acts["end"] - acts["start"]).astype(np.int64)
    time = np.bincount(inverse, weights=durations, minlength=len(unique))
    count = np.bincount(inverse, minlength=len(unique))
    rows: dict[tuple[KernelFamily, str], list[int]] = {}
    for k, ns, n in zip(unique.tolist(), time.tolist(), count.tolist(), strict=True):
        name, rest = k % n_names, k // n_names
        helper, kind = rest % (len(att.helper_names) + 1) - 1, rest // (len(att.helper_names) + 1)
        label = att.name_of(helper)
        category = att.category_of(helper) if helper >= 0 else None
        family = _family(kind, label, category, trace.strings[name])
        row = rows.setdefault((family, label), [0, 0])
        row[0] += n
        row[1] += int(ns)
    total = sum(ns for _, ns in rows.values()) or 1
    out = [
        FamilyRow(family=f, library=lib, activities=n, gpu_time_ns=ns, share=round(ns / total, 4))
        for (f, lib), (n, ns) in rows.items()
    ]
    return sorted(out, key=lambda r: (-r.gpu_time_ns, r.library))[: 2 * TOP_ROWS]


def _self_time(trace: Trace) -> npt.NDArray[np.int64]:
    """Per range row: duration minus the durations of the ranges directly inside it."""
    table = trace.ranges
    duration = (table["end"] - table["start"]).astype(np.int64)
    inner = np.zeros(len(table), dtype=np.int64)
    child = np.flatnonzero(table["parent"] >= 0)
    np.add.at(inner, table["parent"][child], duration[child])
    out: npt.NDArray[np.int64] = np.maximum(duration - inner, 0)
    return out


def _top(trace: Trace, mask: npt.NDArray[np.bool_], *, by_self: bool) -> list[OpRow]:
    rows = np.flatnonzero(mask)
    if len(rows) == 0:
        return []
    names = trace.ranges["name"][rows].astype(np.int64)
    unique, inverse = np.unique(names, return_inverse=True)
    duration = (trace.ranges["end"][rows] - trace.ranges["start"][rows]).astype(np.int64)
    own = _self_time(trace)[rows]
    inclusive = np.bincount(inverse, weights=duration, minlength=len(unique))
    self_ns = np.bincount(inverse, weights=own, minlength=len(unique))
    calls = np.bincount(inverse, minlength=len(unique))
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


def _sync_pointers(trace: Trace, catalog: Catalog) -> list[SyncPointer]:
    """Innermost user Python frame around each host-sync operator, counted per frame and op."""
    table = trace.ranges
    names = table["name"]
    present = np.unique(names).tolist()
    sync = [s for s in present if catalog.is_sync("ops", trace.strings[s])]
    user = [
        s for s in present
        if _FRAME.match(trace.strings[s]) and not _LIBRARY_FRAME.search(trace.strings[s])
    ]
    if not sync or not user:
        return []
    is_sync = np.isin(names, sync) & (table["kind"] == RangeKind.CPU_OP)
    # the outermost sync op only: ``aten::item`` calls ``aten::_local_scalar_dense``
    parent = table["parent"]
    nested = np.zeros(len(table), dtype=bool)
    inside = np.flatnonzero(is_sync & (parent >= 0))
    nested[inside] = is_sync[parent[inside]]
    ops = np.flatnonzero(is_sync & ~nested)
    frames = np.flatnonzero(np.isin(names, user) & (table["kind"] == RangeKind.PYTHON))
    if len(ops) == 0 or len(frames) == 0:
        return []
    index = RangeIndex(
        table["thread"][frames], table["start"][frames], table["end"][frames], frames
    )
    found = index.lookup(table["thread"][ops], table["start"][ops])
    counts = Counter(
        (_frame_text(trace.strings[int(names[f])]), trace.strings[int(names[o])])
        for o, f in zip(ops.tolist(), found.tolist(), strict=True)
        if f >= 0
    )
    return [
        SyncPointer(frame=frame, op=op, calls=n) for (frame, op), n in counts.most_common(TOP_ROWS)
    ]


def _frame_text(name: str) -> str:
    """``train.py(50): zero_tail`` -> ``train.py:50 in zero_tail``."""
    m = _FRAME.match(name)
    return f"{m['file']}:{m['line']} in {m['function']}" if m else name


def do_first(
    findings: Sequence[Finding], pointers: Sequence[SyncPointer], *, gpu: bool = True
) -> list[Action]:
    """At most ``DO_FIRST`` actions: errors and warnings with their saving, largest first
    (unquantified ones after), then the busiest host-sync pointers."""
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
    by_frame: dict[str, list[SyncPointer]] = {}
    for p in pointers:
        by_frame.setdefault(p.frame, []).append(p)
    for frame, mine in by_frame.items():
        ops = ", ".join(p.op for p in mine)
        calls = sum(p.calls for p in mine)
        out.append(
            Action(
                action=f"Take the host sync ({ops}) at {frame} out of the step, or compute the "
                "value on the host",
                evidence=f"{calls} host-sync operator call(s) there: "
                + (
                    "each waits for the GPU to drain its queue"
                    if gpu
                    else "on a GPU tensor each would wait for the device (this run had no GPU "
                    "activity)"
                ),
                rule="host-sync-in-step",
            )
        )
    return out[:DO_FIRST]


def _first_sentence(text: str) -> str:
    cut = re.search(r"(?<=[a-z0-9)\]])\.\s", text)
    return text[: cut.start() + 1] if cut else text


__all__ = ["DO_FIRST", "TOP_ROWS", "do_first", "summarize"]
