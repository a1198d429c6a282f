"""Rules about the packed batch and the CP strategy: token alignment, chunk divisibility, balance.

These need facts from the manifest (token counts, lengths, strategy); the trace adds measured
cross-rank imbalance.
"""

from __future__ import annotations

from typing import Any

from analyzers.findings.context import RuleContext, Target, real_seqlens
from analyzers.report import Evidence, Finding, Severity

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
    required = facts.token_alignment or 8
    checks = [(8, Severity.ERROR), (16, Severity.WARNING)] + (
        [(128, Severity.INFO)] if facts.fp8 else []
    )
    for multiple, severity in checks:
        multiple = max(multiple, required) if severity is Severity.ERROR else multiple
        if tokens % (multiple * cp) == 0:
            continue
        target_tokens = -(-tokens // (multiple * cp)) * multiple * cp
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
                ],
                recommendation=(
                    f"Pad the packed batch to {target_tokens} tokens "
                    f"({target_tokens - tokens} padding "
                    f"tokens; cp_attention.pad_to_multiple(..., {multiple * cp})) and "
                    f"describe the pad in "
                    "cu_seqlens_padded. FP8 GEMMs need the token dimension divisible by 8 (16 "
                    "for some "
                    "layouts, 128 for blockwise scaling); one rank raising while the others "
                    "wait in a "
                    "collective looks like a hang."
                ),
                **common,
            )
        ]
    return []


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
            ],
            recommendation=(
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


def causal_balance(ctx: RuleContext, target: Target) -> list[Finding]:
    """(g) Measured busy imbalance, and what NoLoadBalance all-gather would trade away."""
    out = []
    for item in ctx.metrics.imbalance:
        if (
            item.window == target.group
            and item.metric == "compute_busy_ns"
            and item.max_over_min > IMBALANCE_LIMIT
        ):
            slow = max(item.per_rank, key=lambda r: item.per_rank[r])
            out.append(
                Finding(
                    rule=IMBALANCE,
                    severity=Severity.WARNING,
                    window=target.group,
                    ranks=sorted(item.per_rank),
                    title=(
                        f"GPU compute time (communication excluded) differs "
                        f"{item.max_over_min:.2f}x across ranks in {target.label!r}"
                    ),
                    evidence=[
                        Evidence(
                            name="GPU compute busy per step",
                            value=round(v / 1e6, 3),
                            unit="ms",
                            rank=r,
                            window=target.group,
                        )
                        for r, v in sorted(item.per_rank.items())
                    ],
                    recommendation=(
                        f"Rank {slow} does the most work and the others wait for it; with causal "
                        "attention use DualChunkSwap P2P (balanced by construction), and "
                        "check that "
                        "every rank holds the same number of tokens."
                    ),
                )
            )
    cp, seqlens = target.workload.cp_size or 1, real_seqlens(target.facts, target.workload)
    if cp < 2 or not seqlens or target.workload.causal is False:
        return out
    nlb = _ratio(causal_work_per_rank(seqlens, cp, "no_load_balance"))
    evidence = [
        Evidence(
            name="causal work max/min under NoLoadBalance", value=round(nlb, 3), window=target.group
        )
    ]
    if target.workload.strategy == "no_load_balance" and nlb > IMBALANCE_LIMIT:
        out.append(
            Finding(
                rule=IMBALANCE,
                severity=Severity.WARNING,
                window=target.group,
                evidence=evidence,
                title=(
                    f"NoLoadBalance gives one rank {nlb:.2f}x the causal work of another in "
                    f"{target.label!r}"
                ),
                recommendation=(
                    "Use DualChunkSwap P2P CP (pad lengths to multiples of 2*cp) to balance "
                    "causal work."
                ),
            )
        )
    elif target.workload.strategy != "no_load_balance" and nlb <= 1.10:
        out.append(
            Finding(
                rule=NLB_CANDIDATE,
                severity=Severity.INFO,
                window=target.group,
                evidence=evidence,
                title=(
                    f"NoLoadBalance all-gather would stay balanced ({nlb:.2f}x) for these lengths"
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


RULES = (token_alignment, seqlen_divisibility, causal_balance)
