"""Rules about the packed batch and the CP strategy: token alignment, chunk divisibility, balance.

These need facts from the manifest (token counts, lengths, strategy); the trace adds measured
cross-rank imbalance.
"""

from __future__ import annotations

from typing import Any

from analyzers.findings.context import (
    RuleContext,
    Target,
    per_step_basis,
    real_seqlens,
    timed_stats,
)
from analyzers.findings.observed import observed_evidence, observed_prefix
from analyzers.report import Category, Evidence, Finding, Severity
from analyzers.windows import WHOLE_TRACE

ALIGNMENT = "token-alignment"
DIVISIBILITY = "seqlen-not-divisible"
IMBALANCE = "causal-imbalance"
NLB_CANDIDATE = "no-load-balance-candidate"
IMBALANCE_LIMIT = 1.15
"""Busy-time or causal-work ratio (max/min) above which one rank visibly waits for another."""


def _tokens(target: Target) -> int | None:
    facts = target.facts
    if facts.total_tokens is not None:
        return facts.total_tokens
    for cu in (facts.cu_seqlens_padded, facts.cu_seqlens):
        if cu:
            return cu[-1]
    return sum(target.workload.seqlens) if target.workload.seqlens else None


def token_alignment(ctx: RuleContext, target: Target) -> list[Finding]:
    """(d) Packed token count not a multiple of 8/16/128 under FP8 or FSDP (TE issue #1795)."""
    facts = target.facts
    if not (facts.fp8 or facts.fsdp):
        return []
    why = "FP8" if facts.fp8 else "FSDP"
    tokens = _tokens(target)
    common: dict[str, Any] = {
        "rule": ALIGNMENT,
        "window": target.group,
        "references": ["TE issue #1795"],
    }
    if tokens is None:
        return [
            Finding(
                severity=Severity.WARNING,
                title=f"{why} run without a token count in {target.label!r}",
                recommendation=(
                    "Add facts.total_tokens (or cu_seqlens_padded) to the manifest so cptrace can "
                    "check the FP8 alignment."
                ),
                **common,
            )
        ]
    cp = target.workload.cp_size or 1
    local = tokens // cp
    te_version = _te_version(ctx, target)
    known = ctx.catalog.fp8_multiple(te_version) if facts.fp8 else None
    required = max(known or 8, facts.token_alignment or 8)
    # the pad must run on this TE version; on an unknown one, on every version catalogued
    safe = required if known or not facts.fp8 else max(required, ctx.catalog.fp8_strictest())
    checks = [(required, Severity.ERROR), (16, Severity.WARNING)] + (
        [(128, Severity.INFO)] if facts.fp8 else []
    )
    for multiple, severity in checks:
        if severity is not Severity.ERROR and multiple <= required:
            continue  # the error check already asked for it
        if tokens % (multiple * cp) == 0:
            continue
        pad = max(multiple, safe)
        target_tokens = -(-tokens // (pad * cp)) * pad * cp
        return [
            Finding(
                severity=severity,
                title=(
                    f"{tokens} packed tokens ({local} per rank) are not a multiple of {multiple} "
                    f"per rank under {why}"
                ),
                evidence=[
                    Evidence(name="packed tokens", value=tokens, window=target.group),
                    Evidence(name="tokens per rank", value=local, window=target.group),
                    Evidence(
                        name="required multiple per rank", value=multiple, window=target.group
                    ),
                    *observed_evidence(target, about="tokens"),
                    *_failure_evidence(ctx, target),
                ],
                recommendation=observed_prefix(target, about="tokens") + (
                    f"Pad the packed batch to {target_tokens} tokens "
                    f"({target_tokens - tokens} padding "
                    f"tokens; cp_attention.pad_to_multiple(..., {pad * cp})) and "
                    "describe the pad in cu_seqlens_padded. "
                    + _alignment_reason(facts.fp8, te_version, known, safe)
                    + " One rank raising while the others wait in a collective looks like a "
                    "hang."
                ),
                **common,
            )
        ]
    return []


def _te_version(ctx: RuleContext, target: Target) -> str | None:
    """The TE version the job ran: what the probe saw, else the manifest's environment."""
    observed = target.facts.observed
    if observed is not None and observed.transformer_engine:
        return observed.transformer_engine
    found = ctx.manifest.environment.get("transformer_engine") if ctx.manifest else None
    return found if isinstance(found, str) and found else None


def _alignment_reason(fp8: bool, te_version: str | None, known: int | None, safe: int) -> str:
    """Why that multiple: the TE version's FP8 GEMM requirement from the catalog."""
    if not fp8:
        return "FSDP shards the token dimension; FP8 GEMMs need it divisible by 8 or more."
    if known is not None:
        return (
            f"TE {te_version}'s FP8 GEMMs need the token dimension divisible by {known} "
            "(helper catalog, [fp8_alignment]); 128 for blockwise scaling."
        )
    return (
        f"The TE version is unknown: {safe} is the strictest multiple FP8 GEMMs need on any "
        "catalogued TE version (16 on 2.20.x, whose cuBLASLt GEMMs assert lda % 16 == 0); 128 "
        "for blockwise scaling."
    )


def _failure_evidence(ctx: RuleContext, target: Target) -> list[Evidence]:
    """The run's failure record, when the run died (the #1795 symptom: one rank raised)."""
    failure = ctx.manifest.failure if ctx.manifest else None
    if failure is None or not failure.summary:
        return []
    return [Evidence(name="the run failed", value=failure.summary, window=target.group)]


def seqlen_divisibility(ctx: RuleContext, target: Target) -> list[Finding]:
    """(f) Sequences not divisible by 2*cp under DualChunkSwap."""
    cp = target.workload.cp_size or 1
    strategy = target.workload.strategy
    seqlens = real_seqlens(target.facts, target.workload)
    if (
        cp < 2
        or not seqlens
        or strategy == "no_load_balance"
        or target.workload.cp_comm not in (None, "p2p")
    ):
        return []
    bad = [(i, s) for i, s in enumerate(seqlens) if s % (2 * cp)]
    if not bad:
        return []
    pad = sum(-(-s // (2 * cp)) * 2 * cp - s for _, s in bad)
    return [
        Finding(
            rule=DIVISIBILITY,
            severity=Severity.WARNING,
            window=target.group,
            title=(
                f"{len(bad)} sequence(s) in {target.label!r} are not divisible by 2*cp={2 * cp} "
                f"(DualChunkSwap)"
            ),
            evidence=[
                Evidence(name="lengths (index, tokens)", value=str(bad[:8]), window=target.group),
                Evidence(name="padding tokens needed", value=pad, window=target.group),
                *observed_evidence(target, about="tokens"),
            ],
            recommendation=observed_prefix(target, about="tokens") + (
                f"DualChunkSwap cuts every sequence into {2 * cp} chunks: pad each listed "
                f"sequence to a "
                f"multiple of {2 * cp} ({pad} tokens in all), describe it in distinct "
                f"cu_seqlens_padded "
                "tensors and keep pad_between_seqs=True; or use NoLoadBalance all-gather CP, "
                "which only "
                "needs the packed total divisible by cp."
            ),
        )
    ]


def causal_work_per_rank(seqlens: list[int], cp: int, strategy: str) -> list[float]:
    """Relative causal attention work (query-key pairs) per rank for a partition strategy."""
    work = [0.0] * cp

    def pairs(a: int, b: int) -> float:  # sum of (p + 1) for positions a..b-1
        return (b * (b + 1) - a * (a + 1)) / 2.0

    if strategy == "no_load_balance":
        total = sum(seqlens)
        chunk = total / cp
        offset = 0
        for s in seqlens:
            for r in range(cp):
                lo, hi = max(offset, r * chunk), min(offset + s, (r + 1) * chunk)
                if hi > lo:
                    work[r] += pairs(int(lo - offset), int(hi - offset))
            offset += s
        return work
    for s in seqlens:
        size = s / (2 * cp)
        for r in range(cp):
            for c in (r, 2 * cp - 1 - r):
                work[r] += pairs(int(c * size), int((c + 1) * size))
    return work


def _ratio(values: list[float]) -> float:
    low = min(values)
    return max(values) / low if low > 0 else float("inf")


def attention_gpu_per_rank(ctx: RuleContext, group: str) -> dict[int, float]:
    """GPU time (ms per step) of attention-compute helpers per rank: the work the partition
    strategy balances. Busy time would mix in collectives (and reductions) that spin while they
    wait for the slower rank, hiding the very imbalance they wait for."""
    out: dict[int, float] = {}
    for h in ctx.metrics.helpers:
        if h.window == group and h.category == Category.ATTENTION:
            out[h.rank] = out.get(h.rank, 0.0) + h.gpu_time_ns / max(h.steps, 1) / 1e6
    return out


def _balanced_arm(ctx: RuleContext, target: Target) -> tuple[str, float, int, int] | None:
    """A timed DualChunkSwap arm of the same run: (label, my median - its median, n, n)."""
    mine = timed_stats(ctx, target.group)
    if mine is None:
        return None
    for other in ctx.targets():
        if other.group == target.group or other.workload.strategy == "no_load_balance":
            continue
        if other.workload.cp_comm != target.workload.cp_comm:
            continue
        theirs = timed_stats(ctx, other.group)
        if theirs is not None:
            return other.label, mine.median_ms - theirs.median_ms, mine.n, theirs.n
    return None


def _measured_evidence(
    ctx: RuleContext, target: Target, attention: dict[int, float]
) -> list[Evidence]:
    basis = (
        per_step_basis(target.group, 1)[1]
        if target.group == WHOLE_TRACE
        else "per step (each rank's total / its steps)"
    )
    evidence = [
        Evidence(
            name=f"attention GPU time {basis}",
            value=round(v, 3),
            unit="ms",
            rank=r,
            window=target.group,
        )
        for r, v in sorted(attention.items())
    ]
    for item in ctx.metrics.imbalance:
        if item.window == target.group and item.metric == "compute_busy_ns":
            evidence += [
                Evidence(
                    name=f"GPU computation (clipped timeline) {basis}",
                    value=round(v / 1e6, 3),
                    unit="ms",
                    rank=r,
                    window=target.group,
                )
                for r, v in sorted(item.per_rank.items())
            ]
    return evidence


def causal_balance(ctx: RuleContext, target: Target) -> list[Finding]:
    """(g) Measured attention imbalance, and what NoLoadBalance all-gather would trade away."""
    out = []
    attention = attention_gpu_per_rank(ctx, target.group)
    measured = _ratio(list(attention.values())) if len(attention) > 1 else None
    nlb_arm = target.workload.strategy == "no_load_balance"
    cp, seqlens = target.workload.cp_size or 1, real_seqlens(target.facts, target.workload)
    predicted = (
        _ratio(causal_work_per_rank(seqlens, cp, "no_load_balance"))
        if cp >= 2 and seqlens and target.workload.causal is not False
        else None
    )
    measured_evidence = _measured_evidence(ctx, target, attention) if measured else []
    measured_ratio = (
        [
            Evidence(
                name="attention GPU time max/min (measured)",
                value=round(measured, 3),
                window=target.group,
            )
        ]
        if measured
        else []
    )
    if nlb_arm and predicted is not None and predicted > IMBALANCE_LIMIT:
        work = causal_work_per_rank(seqlens or [], cp, "no_load_balance")
        heavy = max(range(cp), key=lambda r: work[r])
        evidence = [
            Evidence(
                name="causal work max/min under NoLoadBalance (from seqlens)",
                value=round(predicted, 3),
                window=target.group,
            ),
            *measured_ratio,
            *measured_evidence,
        ]
        fields: dict[str, Any] = {}
        arm = _balanced_arm(ctx, target)
        if arm is not None:
            label, diff, _, _ = arm
            evidence.append(
                Evidence(
                    name=f"median iteration difference to arm {label!r} (DualChunkSwap)",
                    value=round(diff, 3),
                    unit="ms",
                    window=target.group,
                )
            )
            if diff > 0:
                other = _median(ctx, label)
                fields = {
                    "expected_saving_ms": round(diff, 4),
                    "saving_basis": "measured",
                    "expected_saving_pct": round(100.0 * diff / (diff + other), 2)
                    if other
                    else None,
                }
        seen = f" (measured attention GPU time: {measured:.2f}x)" if measured else ""
        out.append(
            Finding(
                rule=IMBALANCE,
                severity=Severity.WARNING,
                window=target.group,
                ranks=sorted(attention) or list(range(cp)),
                evidence=evidence,
                title=(
                    f"NoLoadBalance gives rank {heavy} {predicted:.2f}x the causal work of the "
                    f"lightest rank in {target.label!r}{seen}"
                ),
                recommendation=(
                    "Rank "
                    f"{heavy} holds the longest sequences' late tokens and the others wait for it. "
                    "Use DualChunkSwap (pad lengths to multiples of 2*cp) to balance causal work, "
                    "unless the timed arms show NoLoadBalance's single attention step per rank "
                    "winning anyway."
                ),
                references=["TE PR #3221"],
                **fields,
            )
        )
    elif measured is not None and measured > IMBALANCE_LIMIT:
        slow = max(attention, key=lambda r: attention[r])
        out.append(
            Finding(
                rule=IMBALANCE,
                severity=Severity.WARNING,
                window=target.group,
                ranks=sorted(attention),
                title=(
                    f"Attention GPU time differs {measured:.2f}x across ranks in {target.label!r}"
                ),
                evidence=[*measured_ratio, *measured_evidence],
                recommendation=(
                    f"Rank {slow} does the most attention work and the others wait for it. "
                    + (
                        "DualChunkSwap balances causal work by construction, so check that "
                        "every rank holds the same number of tokens and the same sequences' "
                        "chunk pairs."
                        if target.workload.strategy == "dual_chunk_swap"
                        else "With causal attention use DualChunkSwap (balanced by "
                        "construction), and check that every rank holds the same number of "
                        "tokens."
                    )
                ),
            )
        )
    if predicted is None or nlb_arm:
        return out
    if predicted <= 1.10:
        out.append(
            Finding(
                rule=NLB_CANDIDATE,
                severity=Severity.INFO,
                window=target.group,
                evidence=[
                    Evidence(
                        name="causal work max/min under NoLoadBalance",
                        value=round(predicted, 3),
                        window=target.group,
                    )
                ],
                title=(
                    f"NoLoadBalance all-gather would stay balanced ({predicted:.2f}x) for these "
                    f"lengths"
                ),
                recommendation=(
                    "Consider NoLoadBalance all-gather CP (TE PR #3221): one attention step "
                    "per rank "
                    "instead of two, no per-step metadata, no 2*cp divisibility requirement; "
                    "partition inputs and attention with the same strategy."
                ),
                references=["TE PR #3221"],
            )
        )
    return out


def _median(ctx: RuleContext, label: str) -> float | None:
    for target in ctx.targets():
        if target.label == label:
            stats = timed_stats(ctx, target.group)
            return stats.median_ms if stats else None
    return None


RULES = (token_alignment, seqlen_divisibility, causal_balance)
