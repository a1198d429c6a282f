"""The single-device per-rank harness (compute floor) does exactly one rank's CP work.

Every rank's ``rank_local_work`` runs on one CPU process with the other ranks' KV blocks handed
in by a :class:`LoopbackRing`; the dK/dV it would send are collected from ``ring.sent`` and
added to their owners, and the reassembled out/dQ/dK/dV must equal the float64 reference. A
harness that skipped a step, a merge or a correction would fail here.
"""

from __future__ import annotations

import pytest
import torch
from cp_loopback import run_all_ranks
from cp_reference import reference_attention

from cp_attention import PackedBatch, pad_sequences_to_multiple
from cp_attention.attention import Tuning
from cp_attention.merge import gather_rows, gather_sum, sum_parts
from cp_attention.plan import AttnCall, Rows
from cp_attention.ring import LoopbackGather, LoopbackRing

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

CU = (0, 13, 18, 40, 41)  # real lengths 13, 5, 22, 1


TUNINGS = {
    "default": Tuning(),
    "day-1 switches only": Tuning(dq_rows=False, joint_bwd=False),
    "joint bwd": Tuning(joint_bwd=True),
    "joint, whole blocks": Tuning(remote_rows=False, dq_rows=False, joint_bwd=True),
    "dq fp32": Tuning(dq_fp32=True),
    "dq fp32, not in place": Tuning(dq_fp32=True, in_place=False),
    "peers' dK/dV added one by one": Tuning(peer_sum=False),
}


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("strategy", ["dual_chunk_swap", "no_load_balance"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tuning", list(TUNINGS))
def test_every_rank_local_work_reassembles_to_reference(cp: int, strategy: str,
                                                        causal: bool, tuning: str) -> None:
    cup = pad_sequences_to_multiple(CU, 2 * cp)
    meta = PackedBatch.from_cu_seqlens(CU, cup, cp_size=cp, strategy=strategy)
    gen = torch.Generator().manual_seed(cp * 10 + causal)
    total = cup[-1]
    full = {n: torch.randn(total, h, 8, generator=gen, dtype=torch.float64)
            for n, h in (("q", 4), ("k", 2), ("v", 2), ("dout", 4))}
    want = reference_attention(full["q"], full["k"], full["v"], full["dout"], CU, tuple(cup),
                               causal)
    got = run_all_ranks(meta, full, causal, TUNINGS[tuning])
    for name in ("out", "dq", "dk", "dv"):
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("strategy", ["dual_chunk_swap", "no_load_balance"])
@pytest.mark.parametrize("causal", [True, False])
def test_every_rank_all_gather_local_work_reassembles_to_reference(cp: int, strategy: str,
                                                                   causal: bool) -> None:
    """The all-gather comm (KV in sequence order, one or two calls per rank, dK/dV summed and
    moved back to owner order in one pass) equals float64, padding rows included."""
    cup = pad_sequences_to_multiple(CU, 2 * cp)
    meta = PackedBatch.from_cu_seqlens(CU, cup, cp_size=cp, strategy=strategy)
    gen = torch.Generator().manual_seed(cp * 10 + causal + 1)
    full = {n: torch.randn(cup[-1], h, 8, generator=gen, dtype=torch.float64)
            for n, h in (("q", 4), ("k", 2), ("v", 2), ("dout", 4))}
    want = reference_attention(full["q"], full["k"], full["v"], full["dout"], CU, tuple(cup),
                               causal)
    got = run_all_ranks(meta, full, causal, Tuning(), comm="all_gather")
    for name in ("out", "dq", "dk", "dv"):
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_all_gather_plan_is_two_disjoint_in_place_calls(cp: int) -> None:
    """Causal DualChunkSwap: two calls per rank (front chunk, back chunk), every segment
    contiguous (in place), no query row in both calls and no key row twice within a call, as
    many query-key pairs as the rank's ring steps attend; the way back to owner order names
    exactly the keys each call reads."""
    cu = (0, 128, 190, 400)  # every rank's back chunk holds real tokens, up to cp = 8
    cup = pad_sequences_to_multiple(cu, 2 * cp)
    meta = PackedBatch.from_cu_seqlens(cu, cup, cp_size=cp)

    def rows(r: Rows) -> list[int]:
        return r.index.tolist() if r.index is not None else list(range(r.start, r.stop))

    def pairs(call: AttnCall) -> int:
        lq, lk = call.cu_q.diff().long(), call.cu_k.diff().long()
        return int((lq * lk - (lq * (lq - 1) // 2 if call.causal else 0)).sum())

    owner_rows = torch.cat([p for p in meta.partition if isinstance(p, torch.Tensor)])
    for rank in range(cp):
        calls = meta.calls_for("all_gather", True, rank)
        assert len(calls) == 2 and all(c is not None and c.in_place for c in calls)
        q_rows = [rows(c.q_rows) for c in calls]
        assert not set(q_rows[0]) & set(q_rows[1])
        for c in calls:
            assert len(set(rows(c.k_rows))) == c.k_rows.count
        assert sum(map(pairs, calls)) == sum(pairs(c) for c in meta.calls_for("p2p", True, rank)
                                             if c is not None)
        order = meta.gather_order(True, rank)
        assert order.to_seq is not None
        assert torch.equal(owner_rows[order.to_seq], torch.arange(cup[-1]))
        for c, src in zip(calls, order.grad_src, strict=True):
            assert sorted(src[src >= 0].tolist()) == sorted(rows(c.k_rows))
    nlb = PackedBatch.from_cu_seqlens(cu, cup, cp_size=cp, strategy="no_load_balance")
    assert nlb.gather_order(True, 0).to_seq is None  # owner order is sequence order


def test_gather_sum_adds_what_each_index_names() -> None:
    """Rows a source's index leaves negative read nothing there (NaN changes nothing); the
    sum is rounded once to the output dtype."""
    a = torch.tensor([[1.0], [2.0], [float("nan")]])
    b = torch.tensor([[10.0], [float("nan")], [30.0]], dtype=torch.float64)
    out = torch.full((4, 1), 7.0, dtype=torch.float16)
    gather_sum(out, [(a, torch.tensor([1, -1, 0, -1])), (b.half(), torch.tensor([2, 0, -1, -1]))])
    assert out.dtype == torch.float16 and out[:, 0].tolist() == [32.0, 10.0, 1.0, 0.0]


def test_loopback_ring_checks_its_inputs() -> None:
    with pytest.raises(ValueError, match="needs 1 KV blocks and 1 dK/dV pairs"):
        LoopbackRing(0, 2, [], [])
    with pytest.raises(ValueError, match="needs the gathered K and V and 1 dK/dV pairs"):
        LoopbackGather(0, 2, [], [])


def test_plan_marks_in_place_calls() -> None:
    """DualChunkSwap's half-block steps gather rows, and every segment is contiguous."""
    cu = [0, 64, 96, 128]
    meta = PackedBatch.from_cu_seqlens(cu, cp_size=2)
    calls: list[AttnCall] = [c for r in range(2) for c in meta.calls_for("p2p", True, r)
                             if c is not None]
    assert all(c.in_place for c in calls)
    assert sum(c.gathers for c in calls) == 2  # rank 0: Q back half; rank 1: KV front half
    back = meta.calls_for("p2p", True, 0)[1]
    assert back is not None and back.q_starts is not None
    # Back chunks of rank 0 start at local rows 16, 16+32+8, ...: chunk = len/4.
    assert back.q_starts.tolist() == [16, 32 + 8, 48 + 8]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_joint_backward_plan_reads_what_the_steps_read(cp: int) -> None:
    """DualChunkSwap rank cp-1 has a one-call backward; its packed KV holds, per step, exactly
    the rows that step's call reads (so the peers add our dK/dV at the rows they expect)."""
    cup = pad_sequences_to_multiple(CU, 2 * cp)
    meta = PackedBatch.from_cu_seqlens(CU, cup, cp_size=cp)
    assert list(meta.joint) == [(True, cp - 1)]
    assert PackedBatch.from_cu_seqlens(CU, cup, cp_size=cp,
                                       strategy="no_load_balance").joint == {}
    joint = meta.joint_bwd(True, cp - 1)
    assert joint is not None and joint.call.causal and not joint.call.square
    assert joint.call.k_rows.covers(joint.k_total)
    calls = meta.calls_for("p2p", True, cp - 1)
    for step in range(1, cp):
        rows = calls[step].k_rows
        read = rows.index if rows.index is not None else torch.arange(rows.start, rows.stop)
        assert torch.equal(joint.pack_src[step], read)
    packed = torch.cat(joint.pack_dst).sort().values
    assert torch.equal(packed, torch.arange(joint.k_total))  # every packed row filled once
    for src, dst, grad in zip(joint.pack_src, joint.pack_dst, joint.grad_src, strict=True):
        assert torch.equal(grad[src], dst) and int((grad >= 0).sum()) == src.numel()


def test_gather_rows_reads_negative_rows_as_zero() -> None:
    src = torch.arange(12.0).view(4, 3)
    out = torch.full((3, 3), 7.0)
    gather_rows(out, None, src, torch.tensor([2, -1, 0]), other=torch.ones(3, 3))
    assert out.tolist() == [[7.0, 8.0, 9.0], [1.0, 1.0, 1.0], [1.0, 2.0, 3.0]]
    out = torch.zeros(4, 3)
    gather_rows(out, torch.tensor([3, 1]), src, torch.tensor([0, -1]))
    assert out.tolist() == [[0.0] * 3, [0.0] * 3, [0.0] * 3, [0.0, 1.0, 2.0]]


def test_sum_parts_adds_each_part_only_at_its_rows() -> None:
    """Rows outside a part's selection are never read (NaN there changes nothing); rows no part
    covers are zero; the sum is rounded once to the output dtype."""
    like = torch.zeros(6, 2, dtype=torch.float16)
    whole = torch.full((6, 2), 0.5, dtype=torch.float32)
    ranged = torch.full((6, 2), float("nan"))
    ranged[1:3] = 2.0
    indexed = torch.full((6, 2), float("nan"), dtype=torch.float64)
    indexed[[0, 4]] = 3.0
    got = sum_parts([(whole, None, None), (ranged, Rows(1, 3), None),
                     (indexed, Rows(0, 2, torch.tensor([0, 4])), {})], like)
    assert got.dtype == torch.float16
    assert got[:, 0].tolist() == [3.5, 2.5, 2.5, 0.5, 3.5, 0.5]
    only = sum_parts([(ranged, Rows(1, 3), None)], like)
    assert only[:, 1].tolist() == [0.0, 2.0, 2.0, 0.0, 0.0, 0.0]
    assert torch.equal(sum_parts([], like), like)
