"""The kernel-check cases cover every planned block shape, and the check can fail (CPU)."""

from __future__ import annotations

import torch

from cp_attention import PackedBatch
from cp_attention.kernel_check import _plan_packs, _signature, cases, run_case
from cp_attention.local_attention import MathAttention

ALL = cases()


def test_every_planned_call_of_cp_2_4_8_is_a_case() -> None:
    sigs = {(c.group, _signature(c.call, c.q_tokens, c.k_tokens)) for c in ALL}
    for cp in (2, 4, 8):
        for strategy in ("dual_chunk_swap", "no_load_balance"):
            for _, cu, cup in _plan_packs(cp):
                meta = PackedBatch.from_cu_seqlens(cu, cup, cp_size=cp, strategy=strategy)
                for comm in ("p2p", "all_gather"):
                    k_tokens = meta.local_tokens * (cp if comm == "all_gather" else 1)
                    for causal in (True, False):
                        for rank in range(cp):
                            for call in meta.calls_for(comm, causal, rank):
                                if call is not None:
                                    sig = _signature(call, meta.local_tokens, k_tokens)
                                    assert (f"cp{cp} {strategy}", sig) in sigs
                for joint in meta.joint.values():
                    sig = _signature(joint.call, meta.local_tokens, joint.k_total)
                    assert (f"cp{cp} {strategy}", sig) in sigs


def test_packs_cover_the_layouts_the_issue_names() -> None:
    names = " ".join(c.name for c in ALL if c.group == "packs")
    for needle in ("padding between", "tail padding", "single sequence", "length-1",
                   "many short", "GQA", "head dim 64", "head dim 256", "causal", "full"):
        assert needle in names
    assert {c.dim for c in ALL} == {64, 128, 256}
    # DualChunkSwap's half-block steps must be checked in place (no gather) too.
    assert any(c.call.in_place and c.call.gathers for c in ALL if "dual" in c.group)


def test_check_passes_an_exact_kernel_and_fails_a_wrong_one() -> None:
    case = next(c for c in ALL if c.name.startswith("padding between sequences, causal"))

    class Float32Math(MathAttention):
        name = "math32"

    class WrongScale(MathAttention):
        name = "wrong"

        def fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, square, cache=None):
            return super().fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale * 1.5, square)

    cpu = torch.device("cpu")
    good = run_case(case, Float32Math(), cpu, torch.float32, layouts=("packed",))
    bad = run_case(case, WrongScale(), cpu, torch.float32, layouts=("packed",))
    assert good[0].ok and good[0].worst < 1e-5
    assert not bad[0].ok and bad[0].errors["out"] > 3e-2
