"""The account lines of ``_summaries`` against a plain-Python grouping of the same records.

``_summaries`` groups the records by (bucket, line) without sorting them (scatters and counts
in record order); the reference here groups them with a dict and sorts each line's records.
The records are synthetic, over the context and windows of a real (hand-built) trace's
account, and hold the cases the vectorised code must get right: equal durations (the earliest
record is the larger evidence), equal totals (lines ordered by label, then line code), gaps
cut into several pieces whose lines repeat (A, B, A), an activity clipped into two windows of
one rank (one unit of the rank's line), durations too wide for the position encoding, many
records (the sampled path of ``_largest``) and no records at all.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import numpy.typing as npt
import pytest

from analyzers.account.build import (
    LARGEST,
    PART_ORDER,
    Line,
    PartDict,
    _Context,
    _summaries,
    compute_accounts,
)
from analyzers.catalog import load_catalog
from analyzers.model import RangeKind
from analyzers.pipeline import analyze_trace
from analyzers.report import AccountPartKind as K
from analyzers.timeline import TimelineWindow
from tests.analyzers.factories import TraceBuilder

IntArray = npt.NDArray[np.int64]
Records = tuple[IntArray, IntArray, IntArray, IntArray, IntArray, IntArray]


@pytest.fixture(scope="module")
def account() -> tuple[_Context, list[TimelineWindow]]:
    """A real account context (lines, threads, activity rows) and its windows: three steps on
    rank 0, two on rank 1, kernels launched from two threads."""
    b = TraceBuilder()
    for rank in (0, 1):
        for i, (lo, hi) in enumerate([(0, 1000), (1000, 2000), (2000, 3000)][: 3 - rank]):
            b.range(f"ProfilerStep#{i + 1}", lo, hi, kind=RangeKind.STEP, rank=rank, process=rank)
            b.kernel("gemm", lo + 10, lo + 50, 300, rank=rank, process=rank, thread=1)
            b.kernel(
                "elementwise_kernel", lo + 20, lo + 400, 200, rank=rank, process=rank, thread=2
            )
    an = analyze_trace(b.build())
    accounts = compute_accounts(
        an.trace,
        an.attribution,
        an.ranges,
        load_catalog(),
        an.report.windows,
        an.metrics.steps,
        an.metrics.gpu,
    )
    ctx = accounts.context
    assert ctx is not None and len(ctx.thread_labels) >= 2
    # lines with equal part and label (ordered by code) and labels out of code order
    for line in (
        Line(K.IDLE_OTHER, "b queued"),
        Line(K.IDLE_OTHER, "a queued"),
        Line(K.IDLE_PEER, "send", None, "last to arrive: rank 1"),
        Line(K.IDLE_PEER, "send", None, "last to arrive: rank 0"),
        Line(K.IDLE_HOST, "helper A"),
        Line(K.IDLE_HOST, "helper B"),
    ):
        ctx.lines.code(line)
    windows = [w for w in ctx.gpu.windows if w.window.name != "whole trace"]
    assert [w.window.rank for w in windows] == [0, 0, 0, 1, 1]
    return ctx, windows


def _reference(
    ctx: _Context,
    bucket: IntArray,
    records: Records,
    windows: list[TimelineWindow],
    largest: IntArray,
) -> dict[int, list[PartDict]]:
    """Group by (bucket, line) in a dict; distinct units as a set; evidence by sorting."""
    seg, code, dur, start, thread, unit = (c.tolist() for c in records)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, key in enumerate(zip(bucket.tolist(), code, strict=True)):
        groups[key].append(i)
    names = ctx.thread_labels
    out: dict[int, list[PartDict]] = {}
    for (b, c), rows in sorted(groups.items()):
        per_thread: Counter[int] = Counter()
        for i in rows:
            per_thread[thread[i]] += dur[i]
        top = sorted(rows, key=lambda i: (-dur[i], i))[: int(largest[b])]
        line = ctx.lines.lines[c]
        out.setdefault(b, []).append(
            {
                "part": line.part,
                "label": line.label,
                "category": line.category,
                "time_ns": sum(dur[i] for i in rows),
                "gaps": len({unit[i] for i in rows}),
                "largest": [
                    {
                        "start_ns": start[i],
                        "offset_ns": start[i] - windows[seg[i]].start_ns,
                        "duration_ns": dur[i],
                        "window": windows[seg[i]].window.name,
                        "index": windows[seg[i]].window.index,
                        "thread": names[thread[i]],
                    }
                    for i in top
                ],
                "thread": names[min(per_thread, key=lambda t: (-per_thread[t], t))],
                "detail": line.detail,
            }
        )
    for parts in out.values():  # stable: equal (part, time, label) stay in line code order
        parts.sort(key=lambda p: (PART_ORDER.index(p["part"]), -p["time_ns"], p["label"]))
    return out


def _columns(rows: list[tuple[int, int, int, int, int, int]]) -> Records:
    if not rows:
        empty = np.empty(0, dtype=np.int64)
        return (empty, empty, empty, empty, empty, empty)
    seg, code, dur, start, thread, unit = (
        np.array(c, dtype=np.int64) for c in zip(*rows, strict=True)
    )
    return (seg, code, dur, start, thread, unit)


HAND_MADE_ACTIVITIES, HAND_MADE_GAPS = 2, 8
"""The units ``_hand_made`` takes: activity rows 0 and 1, the first 8 gaps."""


def _hand_made(ctx: _Context) -> list[tuple[int, int, int, int, int, int]]:
    """(window, line, duration, start, thread, unit) rows with each case written out."""
    code = {line: c for c, line in enumerate(ctx.lines.lines)}
    queued_b, queued_a = code[Line(K.IDLE_OTHER, "b queued")], code[Line(K.IDLE_OTHER, "a queued")]
    peer1 = code[Line(K.IDLE_PEER, "send", None, "last to arrive: rank 1")]
    peer0 = code[Line(K.IDLE_PEER, "send", None, "last to arrive: rank 0")]
    host_a, host_b = code[Line(K.IDLE_HOST, "helper A")], code[Line(K.IDLE_HOST, "helper B")]
    gap = len(ctx.att.helper)  # gap units come after the activity rows
    return [
        # activity 0 clipped at the step boundary: one record of peer1 in windows 0 and 1
        (0, peer1, 40, 960, 1, 0),
        (1, peer1, 40, 1000, 1, 0),
        (0, peer0, 80, 100, 1, 1),  # in rank 0: the total of peer1 (40 + 40)
        (0, queued_b, 30, 200, 0, gap),  # equal totals: "a queued" first, then "b queued"
        (0, queued_a, 30, 300, 0, gap + 1),
        # one gap cut into A, B, A, B, A: two units, one per line
        (0, host_a, 5, 400, 1, gap + 2),
        (0, host_b, 7, 405, 1, gap + 2),
        (0, host_a, 7, 412, 1, gap + 2),  # ties the B piece: the earlier record is larger
        (0, host_b, 3, 419, 1, gap + 2),
        (0, host_a, 9, 422, 1, gap + 2),
        (0, host_a, 7, 500, 0, gap + 3),  # another gap of line A: equal to the one at 412
        (2, host_a, 11, 2100, 0, gap + 4),
        (2, host_a, 11, 2200, 1, gap + 5),  # equal thread times: the lower thread code
        (3, host_b, 6, 100, 1, gap + 6),
        (4, host_b, 6, 1100, 1, gap + 7),
    ]


def _random(ctx: _Context, n_gaps: int, seed: int) -> list[tuple[int, int, int, int, int, int]]:
    """Many records: activities with one record per (window, line), some clipped into the
    next window of their rank; gaps of 1-9 consecutive pieces of random lines; durations from
    a small set, so equal ones are common."""
    rng = np.random.default_rng(seed)
    n_lines, n_threads = len(ctx.lines.lines), len(ctx.thread_labels)
    activities = len(ctx.att.helper)
    rows: list[tuple[int, int, int, int, int, int]] = []
    for act in range(HAND_MADE_ACTIVITIES, activities):
        # an activity has one record per line and window: its line, and a second line in
        # some windows (exposed and waiting NCCL time), and is clipped into the next window of
        # its rank now and then
        lines = rng.choice(n_lines, size=2, replace=False).tolist()
        chosen = set(rng.choice(5, size=int(rng.integers(1, 3)), replace=False).tolist())
        chosen |= {w + 1 for w in chosen if w in (0, 1, 3) and rng.random() < 0.5}
        thread = int(rng.integers(n_threads))
        for w in sorted(chosen):
            for line in lines[: int(rng.integers(1, 3))]:
                rows.append((w, line, int(rng.integers(1, 50)), 0, thread, act))
    for g in range(n_gaps):
        w, thread = int(rng.integers(5)), int(rng.integers(n_threads))
        for _ in range(int(rng.integers(1, 10))):
            start = int(rng.integers(1 << 20))
            line, duration = int(rng.integers(n_lines)), int(rng.choice([1, 2, 3, 5, 8, 13]))
            rows.append((w, line, duration, start, thread, activities + HAND_MADE_GAPS + g))
    return rows


def _check(ctx: _Context, windows: list[TimelineWindow], records: Records) -> None:
    """Both bucketings ``_account_batch`` uses: per window, and per rank of the windows; and
    rank buckets numbered far apart, where the keys are recoded densely (few keys over a
    range too wide for tables indexed by the keys themselves)."""
    n_codes = len(ctx.lines.lines)
    seg = records[0]
    per_window = np.array([1, LARGEST, 1, 1, LARGEST], dtype=np.int64)
    got = _summaries(ctx, seg, records, windows, n_codes, per_window=True, largest=per_window)
    assert got == _reference(ctx, seg, records, windows, per_window)
    rank = np.array([w.window.rank for w in windows], dtype=np.int64)[seg]
    per_rank = np.full(2, LARGEST, dtype=np.int64)
    got = _summaries(ctx, rank, records, windows, n_codes, per_window=False, largest=per_rank)
    assert got == _reference(ctx, rank, records, windows, per_rank)
    far = rank * 5000
    per_far = np.full(5001, LARGEST, dtype=np.int64)
    got = _summaries(ctx, far, records, windows, n_codes, per_window=False, largest=per_far)
    assert got == _reference(ctx, far, records, windows, per_far)


def test_hand_made_records_match_the_plain_grouping(
    account: tuple[_Context, list[TimelineWindow]],
) -> None:
    ctx, windows = account
    records = _columns(_hand_made(ctx))
    _check(ctx, windows, records)
    n_codes = len(ctx.lines.lines)
    rank = np.array([w.window.rank for w in windows], dtype=np.int64)[records[0]]
    got = _summaries(ctx, rank, records, windows, n_codes, per_window=False, largest=np.full(2, 3))
    peer = [p for p in got[0] if p["part"] == K.IDLE_PEER]
    # 80 ns each: the clipped activity is one unit; equal totals keep the line code order
    assert [(p["detail"], p["time_ns"], p["gaps"]) for p in peer] == [
        ("last to arrive: rank 1", 80, 1),
        ("last to arrive: rank 0", 80, 1),
    ]
    host_a = next(p for p in got[0] if p["label"] == "helper A")
    assert host_a["gaps"] == 4  # gaps 2, 3, 4 and 5 (one of A, B, A, B, A; three of A alone)


@pytest.mark.parametrize("seed", [0, 1])
def test_many_random_records_match_the_plain_grouping(
    account: tuple[_Context, list[TimelineWindow]], seed: int
) -> None:
    ctx, windows = account
    rows = _random(ctx, n_gaps=1500, seed=seed)
    assert len(rows) > 64 * 32  # past ``_largest``'s sampling threshold
    _check(ctx, windows, _columns(_hand_made(ctx) + rows))


def test_durations_too_wide_for_the_position_encoding_match_the_plain_grouping(
    account: tuple[_Context, list[TimelineWindow]],
) -> None:
    ctx, windows = account
    rows = _hand_made(ctx)
    # d * n >= 2**62 with the 15 records
    wide = [
        (w, c, 1 << 58 if i % 3 == 0 else d, s, t, u) for i, (w, c, d, s, t, u) in enumerate(rows)
    ]
    _check(ctx, windows, _columns(wide))
    big = _hand_made(ctx) + _random(ctx, n_gaps=1500, seed=2)
    big[5] = (*big[5][:2], 1 << 52, *big[5][3:])
    _check(ctx, windows, _columns(big))


def test_no_records_give_no_lines(account: tuple[_Context, list[TimelineWindow]]) -> None:
    ctx, windows = account
    records = _columns([])
    n_codes = len(ctx.lines.lines)
    largest = np.full(5, LARGEST, dtype=np.int64)
    for per_window in (True, False):
        got = _summaries(ctx, records[0], records, windows, n_codes, per_window, largest)
        assert got == {}
