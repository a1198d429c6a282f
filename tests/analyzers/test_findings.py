"""Findings fire exactly when the trace and the manifest facts say so, and never otherwise."""

from __future__ import annotations

import pytest

from analyzers.findings import evaluate
from analyzers.findings.context import LAUNCH_HOST_COST_US
from analyzers.manifest import parse_manifest
from analyzers.metrics import Metrics
from analyzers.report import (
    Category,
    HelperStat,
    HostSyncStat,
    Imbalance,
    IterationStats,
    Severity,
)
from analyzers.stats import iteration_stats

EQUAL = [0, 8192, 12288, 14336, 16384]
TAIL = [0, 8190, 12286, 14334, 16382]  # first length 8190 is not divisible by 2*cp = 4
TAIL_PADDED = [0, 8192, 12288, 14336, 16384]
WORKLOAD = {
    "implementation": "te",
    "cp_size": 2,
    "cp_comm": "p2p",
    "strategy": "dual_chunk_swap",
    "causal": True,
    "seqlens": [8192, 4096, 2048, 2048],
}


def _stat(
    group: str,
    helper: str,
    category: Category,
    launches: int,
    rank: int = 0,
    gpu: int = 100_000,
    host: int = 400_000,
    steps: int = 3,
) -> HelperStat:
    return HelperStat(
        rank=rank,
        window=group,
        steps=steps,
        helper=helper,
        category=category,
        launches=launches,
        activities=launches,
        kernels=launches,
        gpu_time_ns=gpu,
        matched_by="python",
        calls=launches,
        host_time_ns=host,
    )


def _metrics(groups: dict[str, list[HelperStat]], **extra: object) -> Metrics:
    steps = {(s.rank, g): s.steps for g, rows in groups.items() for s in rows}
    m = Metrics(windows=[], groups=[*groups, "whole trace"], steps=steps)
    m.helpers = [s for rows in groups.values() for s in rows]
    for key, value in extra.items():
        setattr(m, key, value)
    return m


def _slow_arm(group: str = "arm:auto_clone") -> list[HelperStat]:
    return (
        [_stat(group, "get_cu_seqlens_on_cp_rank", Category.METADATA, 48, rank=r) for r in (0, 1)]
        + [_stat(group, "te_thd_grad_zero_fill", Category.ZERO_FILL, 276, rank=r) for r in (0, 1)]
        + [_stat(group, "te_fused_attn_fwd", Category.ATTENTION, 168, rank=r) for r in (0, 1)]
    )


def _fast_arm(group: str = "arm:explicit_false") -> list[HelperStat]:
    return [s for s in _slow_arm(group) if s.helper != "get_cu_seqlens_on_cp_rank"]


def _manifest(
    facts: dict,
    window: str = "arm:auto_clone",
    workload: dict | None = None,
    more: list | None = None,
) -> object:
    return parse_manifest(
        {
            "workload": workload or WORKLOAD,
            "variants": [
                {"name": window.split(":")[-1], "window": window, "facts": facts},
                *(more or []),
            ],
        }
    )


def _rules(findings) -> dict[str, Severity]:
    return {f.rule: f.severity for f in findings}


def test_padded_path_with_equal_cu_seqlens_recommends_fast_path() -> None:
    facts = {"cu_seqlens": EQUAL, "cu_seqlens_padded": EQUAL, "padded_is_same_object": False}
    findings = evaluate(_metrics({"arm:auto_clone": _slow_arm()}), _manifest(facts))
    padded = next(f for f in findings if f.rule == "padded-path-without-padding")
    assert padded.severity is Severity.WARNING and padded.helper == "get_cu_seqlens_on_cp_rank"
    assert "pad_between_seqs=False" in padded.recommendation
    assert "AdaptedDotProductAttention" in padded.recommendation
    assert padded.ranks == [0, 1]
    # no timed arm without the helper: GPU time + launches x the per-launch host cost, per step
    # (48 launches and 100 us of GPU over 3 steps); the profiled host time (400 us) is not used
    assert padded.expected_saving_ms == pytest.approx(
        0.1 / 3 + 16 * LAUNCH_HOST_COST_US / 1e3, abs=1e-4
    )
    assert padded.saving_basis == "estimate"
    basis = next(e.value for e in padded.evidence if e.name == "saving basis")
    assert str(basis).startswith("estimate:") and "16 CPU launch calls" in str(basis)
    assert _rules(findings)["zero-fill-without-padding"] is Severity.WARNING
    assert "fast-path-with-padding" not in _rules(findings)


def test_padded_path_saving_from_the_arm_without_the_helper() -> None:
    facts = {"cu_seqlens": EQUAL, "cu_seqlens_padded": EQUAL}
    fast = {
        "name": "explicit_false",
        "window": "arm:explicit_false",
        "facts": {**facts, "pad_between_seqs": False},
    }
    manifest = _manifest(facts, more=[fast])
    iterations = [
        iteration_stats("arm:auto_clone", [21.3, 21.2, 21.4], source="timed"),
        iteration_stats("arm:explicit_false", [18.6, 18.5, 18.7], source="timed"),
    ]
    metrics = _metrics({"arm:auto_clone": _slow_arm(), "arm:explicit_false": _fast_arm()})
    findings = evaluate(metrics, manifest, iterations=iterations)
    padded = [f for f in findings if f.rule == "padded-path-without-padding"]
    assert len(padded) == 1 and padded[0].window == "arm:auto_clone"
    assert padded[0].expected_saving_ms == pytest.approx(2.7)
    assert padded[0].expected_saving_pct == pytest.approx(100 * 2.7 / 21.3, abs=0.01)
    assert padded[0].saving_basis == "measured"
    assert not [f for f in findings if f.severity is Severity.ERROR]


def test_padded_path_is_correct_when_any_entry_differs_even_the_last() -> None:
    padded = [*EQUAL[:-1], 16392]
    findings = evaluate(
        _metrics({"arm:auto_clone": _slow_arm()}),
        _manifest({"cu_seqlens": EQUAL, "cu_seqlens_padded": padded}),
    )
    rules = _rules(findings)
    assert rules.get("padded-path-needed") is Severity.INFO
    assert "padded-path-without-padding" not in rules
    assert "zero-fill-without-padding" not in rules


def test_padded_path_without_facts_states_what_is_needed() -> None:
    findings = evaluate(_metrics({"arm:auto_clone": _slow_arm()}), None)
    padded = next(f for f in findings if f.rule == "padded-path-without-padding")
    assert padded.severity is Severity.WARNING
    assert "cu_seqlens_padded" in padded.recommendation and "manifest" in padded.recommendation
    assert padded.expected_saving_ms is None


def test_tail_padding_with_pad_between_seqs_false_is_an_error() -> None:
    facts = {"cu_seqlens": TAIL, "cu_seqlens_padded": TAIL, "pad_between_seqs": False}
    findings = evaluate(
        _metrics({"arm:explicit_false": _fast_arm()}), _manifest(facts, window="arm:explicit_false")
    )
    error = next(f for f in findings if f.rule == "fast-path-with-padding")
    assert error.severity is Severity.ERROR and findings[0] is error
    assert "TE issue #3331" in error.references
    assert (
        str(TAIL_PADDED) in error.recommendation and "pad_between_seqs=True" in error.recommendation
    )
    assert "seqlen-not-divisible" in _rules(findings)


def test_fast_path_from_same_object_or_trace_with_real_padding_is_an_error() -> None:
    differs = [*EQUAL[:2], 12300, 14348, 16396]
    same = {"cu_seqlens": EQUAL, "cu_seqlens_padded": differs, "padded_is_same_object": True}
    # Same object => values equal by definition; then only the trace can reveal the mistake.
    findings = evaluate(_metrics({"arm:x": _fast_arm("arm:x")}), _manifest(same, window="arm:x"))
    assert "fast-path-with-padding" not in _rules(findings)
    seen_in_trace = {"cu_seqlens": EQUAL, "cu_seqlens_padded": differs}
    findings = evaluate(
        _metrics({"arm:x": _fast_arm("arm:x")}), _manifest(seen_in_trace, window="arm:x")
    )
    error = next(f for f in findings if f.rule == "fast-path-with-padding")
    assert "no get_cu_seqlens_on_cp_rank launches" in str(error.evidence[0].value)


def test_fast_path_without_padding_is_fine() -> None:
    facts = {"cu_seqlens": EQUAL, "cu_seqlens_padded": EQUAL, "pad_between_seqs": False}
    findings = evaluate(
        _metrics({"arm:explicit_false": _fast_arm()}), _manifest(facts, window="arm:explicit_false")
    )
    assert not [f for f in findings if f.severity is Severity.ERROR]
    assert "padded-path-without-padding" not in _rules(findings)


@pytest.mark.parametrize(
    ("tokens", "fp8", "fsdp", "expected"),
    [
        (16382, True, False, Severity.ERROR),  # 8191 per rank
        (16392, True, False, Severity.ERROR),  # 8196 per rank: not a multiple of 8
        (16400, True, False, Severity.WARNING),  # 8200 per rank: multiple of 8, not 16
        (16416, True, False, Severity.INFO),  # 8208 per rank: multiple of 16, not 128
        (16384, True, False, None),
        (16382, False, True, Severity.ERROR),
        (16382, False, False, None),
    ],
)
def test_token_alignment(tokens: int, fp8: bool, fsdp: bool, expected: Severity | None) -> None:
    facts = {"total_tokens": tokens, "fp8": fp8, "fsdp": fsdp}
    findings = evaluate(_metrics({"arm:x": _fast_arm("arm:x")}), _manifest(facts, window="arm:x"))
    got = [f for f in findings if f.rule == "token-alignment"]
    if expected is None:
        assert got == []
    else:
        assert got[0].severity is expected and "TE issue #1795" in got[0].references


def test_host_sync_inside_step() -> None:
    syncs = [
        HostSyncStat(
            rank=0,
            window="ProfilerStep",
            steps=5,
            helper="get_batch_on_this_cp_rank",
            calls=10,
            blocked_ns=5_000_000,
            api="cudaStreamSynchronize",
        ),
        HostSyncStat(
            rank=0,
            window="ProfilerStep",
            steps=5,
            helper="(unattributed)",
            calls=5,
            blocked_ns=1_000_000,
            api="cudaDeviceSynchronize",
        ),
    ]
    findings = evaluate(_metrics({"ProfilerStep": []}, host_syncs=syncs), None)
    got = {f.helper: f for f in findings if f.rule == "host-sync-in-step"}
    assert got["get_batch_on_this_cp_rank"].severity is Severity.WARNING
    assert got["get_batch_on_this_cp_rank"].expected_saving_ms == pytest.approx(1.0)
    assert got[None].severity is Severity.INFO
    assert evaluate(_metrics({"ProfilerStep": []}), None) == []


def test_dual_chunk_swap_divisibility_and_no_load_balance_tradeoff() -> None:
    odd = {**WORKLOAD, "seqlens": [8190, 4094, 2050, 2050]}
    findings = evaluate(
        _metrics({"arm:x": _fast_arm("arm:x")}), _manifest({}, window="arm:x", workload=odd)
    )
    div = next(f for f in findings if f.rule == "seqlen-not-divisible")
    assert div.evidence[1].value == 2 + 2 + 2 + 2
    # The reference lengths under NoLoadBalance: rank 0 gets all of the 8192 sequence -> 2.67x.
    nlb = {**WORKLOAD, "strategy": "no_load_balance", "cp_comm": "all_gather"}
    findings = evaluate(
        _metrics({"arm:x": _fast_arm("arm:x")}), _manifest({}, window="arm:x", workload=nlb)
    )
    imb = next(f for f in findings if f.rule == "causal-imbalance")
    assert imb.evidence[0].value == pytest.approx(2.667, abs=0.01)
    many_short = {**WORKLOAD, "seqlens": [512] * 32}
    findings = evaluate(
        _metrics({"arm:x": _fast_arm("arm:x")}), _manifest({}, window="arm:x", workload=many_short)
    )
    assert _rules(findings).get("no-load-balance-candidate") is Severity.INFO
    assert "causal-imbalance" not in _rules(findings)


def _attention(group: str, per_rank_gpu: dict[int, int]) -> list[HelperStat]:
    return [
        _stat(group, "te_fused_attn_fwd", Category.ATTENTION, 56, rank=r, gpu=gpu)
        for r, gpu in per_rank_gpu.items()
    ]


def test_measured_attention_imbalance() -> None:
    # compute busy agrees with attention here; the rule reads attention GPU time because busy
    # time includes reductions that spin while waiting for the slow rank
    imbalance = [
        Imbalance(
            window="arm:x",
            metric="compute_busy_ns",
            per_rank={0: 10e6, 1: 13e6},
            max_over_min=1.3,
            max_over_mean=1.13,
        )
    ]
    uneven = _attention("arm:x", {0: 10_000_000, 1: 13_000_000})
    findings = evaluate(_metrics({"arm:x": uneven}, imbalance=imbalance), None)
    got = next(f for f in findings if f.rule == "causal-imbalance")
    assert got.severity is Severity.WARNING and "Rank 1" in got.recommendation
    ratio = next(e for e in got.evidence if e.name.startswith("attention GPU time max/min"))
    assert ratio.value == pytest.approx(1.3)
    # busy time alone (spinning collectives, metadata kernels) does not make a causal imbalance
    even = _attention("arm:x", {0: 10_000_000, 1: 10_500_000})
    assert not evaluate(_metrics({"arm:x": even}, imbalance=imbalance), None)
    # under DualChunkSwap the partition is balanced by construction: say what else to check
    manifest = parse_manifest({"workload": {**WORKLOAD, "seqlens": None}})
    dcs = next(
        f
        for f in evaluate(_metrics({"arm:x": uneven}, imbalance=imbalance), manifest)
        if f.rule == "causal-imbalance"
    )
    assert "balances causal work by construction" in dcs.recommendation


def test_iteration_stats_type_is_accepted() -> None:
    stats = IterationStats(
        label="arm:x",
        rank=None,
        n=1,
        median_ms=1,
        p10_ms=1,
        p90_ms=1,
        iqr_ms=0,
        mean_ms=1,
        min_ms=1,
        max_ms=1,
        samples_ms=[1],
    )
    assert evaluate(_metrics({"arm:x": []}), None, iterations=[stats]) == []


def test_whole_trace_evidence_never_says_per_step() -> None:
    # a trace without steps: its only target is the whole trace (steps=1), 8 real iterations
    rows = [
        s.model_copy(update={"steps": 1, "first_call_host_ns": 300_000})
        for s in _slow_arm("whole trace")
    ]
    m = Metrics(windows=[], groups=["whole trace"], steps={(0, "whole trace"): 1})
    m.helpers = rows
    facts = {"cu_seqlens": EQUAL, "cu_seqlens_padded": EQUAL, "padded_is_same_object": False}
    findings = evaluate(m, _manifest(facts, window="whole trace"))
    padded = next(f for f in findings if f.rule == "padded-path-without-padding")
    names = [e.name for e in padded.evidence]
    assert not any("per step" in n for n in names), names
    assert any(n.startswith("CPU launch calls in the whole trace") for n in names)
    # whole-trace totals are not per iteration: no per-iteration saving is claimed from them
    assert padded.expected_saving_ms is None and padded.saving_basis == "estimate"
    basis = next(str(e.value) for e in padded.evidence if e.name == "saving basis")
    assert "in the whole trace, not per iteration" in basis


def test_step_evidence_says_how_it_divides_and_keeps_the_first_call_apart() -> None:
    rows = [s.model_copy(update={"first_call_host_ns": 300_000}) for s in _slow_arm()]
    facts = {"cu_seqlens": EQUAL, "cu_seqlens_padded": EQUAL, "padded_is_same_object": False}
    findings = evaluate(_metrics({"arm:auto_clone": rows}), _manifest(facts))
    padded = next(f for f in findings if f.rule == "padded-path-without-padding")
    by_name = {(e.name, e.rank): e.value for e in padded.evidence}
    launches = "CPU launch calls per step (total / 3 steps) (get_cu_seqlens_on_cp_rank)"
    assert by_name[(launches, 0)] == 16.0
    # 400 us host time over 3 steps, of which the first call took 300 us
    steady = "host time in the helper per step (total / 3 steps), first call excluded"
    assert by_name[(steady, 0)] == pytest.approx(0.1 / 3, abs=1e-4)
    first = "host time of the first call alone (compilation, warm-up)"
    assert by_name[(first, 0)] == 0.3
