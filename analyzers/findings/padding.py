"""Rules about TE's padding detector: the slow padded path, the wrong fast path, needless zero-fill.

Background (DESIGN problem 1): TE >= 2.18 with ``pad_between_seqs=None`` decides "padded" by
object identity, so value-equal clones take the padded path (``get_cu_seqlens_on_cp_rank`` twice
per CP step, gradient zero-fill). The opposite mistake, the fast path while real padding exists
(including a tail pad making a length divisible by 2*cp), silently corrupts attention under P2P
CP (TE issue #3331). The trace shows which path ran; only the manifest can show the values.
"""

from __future__ import annotations

from typing import Any

from analyzers.findings.context import (
    RuleContext,
    Target,
    helper_evidence,
    measured_cost_ms,
    padding_differences,
    real_seqlens,
    saving_from_arms,
)
from analyzers.metrics import per_step
from analyzers.report import Category, Evidence, Finding, Severity

PADDED_PATH = "padded-path-without-padding"
ZERO_FILL = "zero-fill-without-padding"
FAST_PATH_WITH_PADDING = "fast-path-with-padding"
ADAPTER = "cp_attention.te_adapter.AdaptedDotProductAttention"
FACTS_NEEDED = (
    "add to the run manifest (variants[].facts): cu_seqlens, cu_seqlens_padded (and the _kv "
    "pair if it differs), padded_is_same_object and pad_between_seqs; see docs/manifest.md"
)


def _cp(target: Target) -> int:
    return target.workload.cp_size or 1


def _tail_unaligned(target: Target) -> list[int]:
    """Real lengths a P2P DualChunkSwap split cannot cut into 2*cp equal chunks."""
    seqlens = real_seqlens(target.facts, target.workload)
    if not seqlens or target.workload.strategy == "no_load_balance" or _cp(target) < 2:
        return []
    if target.workload.cp_comm not in (None, "p2p"):
        return []
    return [s for s in seqlens if s % (2 * _cp(target))]


def _saving(
    ctx: RuleContext, target: Target, helpers: list[str]
) -> tuple[float, float | None, list[Evidence]]:
    stats = ctx.stats(target.group, helpers)
    cost = measured_cost_ms(stats)
    evidence: list[Evidence] = []
    arm = saving_from_arms(ctx, target, helpers)
    if arm is not None:
        cost = arm[0]
        evidence.append(
            Evidence(
                name=f"median iteration difference to arm {arm[1]!r}",
                value=round(arm[0], 3),
                unit="ms",
                window=target.group,
            )
        )
    median = ctx.iteration_median(target.group)
    return cost, (100.0 * cost / median if median else None), evidence


def padded_path(ctx: RuleContext, target: Target) -> list[Finding]:
    """(a) TE's padded path although every cu_seqlens entry equals its padded twin."""
    helpers = ctx.helpers_feeding(PADDED_PATH)
    stats = ctx.stats(target.group, helpers)
    if per_step(stats) == 0:
        return []
    evidence = helper_evidence(stats, target.group)
    differences = padding_differences(target.facts)
    base: dict[str, Any] = {
        "helper": ", ".join(sorted({s.helper for s in stats})),
        "window": target.group,
        "ranks": sorted({s.rank for s in stats}),
        "references": ["TE >= 2.18 identity-based padding detector"],
    }
    if differences is None:
        return [
            Finding(
                rule=PADDED_PATH,
                severity=Severity.WARNING,
                evidence=evidence,
                title=(
                    f"TE took the padded THD path in {target.label!r}; the trace cannot tell "
                    f"whether padding exists"
                ),
                recommendation=f"To decide whether pad_between_seqs=False is safe, {FACTS_NEEDED}.",
                **base,
            )
        ]
    if differences or _tail_unaligned(target):
        detail = differences[:3] or [f"lengths not divisible by 2*cp: {_tail_unaligned(target)}"]
        return [
            Finding(
                rule="padded-path-needed",
                severity=Severity.INFO,
                evidence=[
                    *evidence,
                    Evidence(name="padding", value="; ".join(detail), window=target.group),
                ],
                title=f"Padded THD path in {target.label!r} is required: the batch is padded",
                recommendation=(
                    "Keep the padded path (pad_between_seqs=True or distinct padded cu_seqlens); "
                    "do not pass pad_between_seqs=False here."
                ),
                **base,
            )
        ]
    saving, pct, more = _saving(ctx, target, helpers)
    return [
        Finding(
            rule=PADDED_PATH,
            severity=Severity.WARNING,
            evidence=[
                *evidence,
                *more,
                Evidence(
                    name="cu_seqlens == cu_seqlens_padded in every entry",
                    value=True,
                    window=target.group,
                ),
            ],
            title=f"TE ran the padded THD path in {target.label!r} although nothing is padded",
            recommendation=(
                "cu_seqlens_padded equals cu_seqlens in every entry (the last included), so pass "
                "pad_between_seqs=False to DotProductAttention.forward, or pass the same "
                "tensor object "
                f"for cu_seqlens_q_padded/cu_seqlens_kv_padded, or use {ADAPTER}, which "
                f"decides from values."
            ),
            expected_saving_ms=round(saving, 4),
            expected_saving_pct=None if pct is None else round(pct, 2),
            **base,
        )
    ]


def _fast_path(ctx: RuleContext, target: Target) -> str | None:
    """Why this group took TE's unpadded P2P path, or None."""
    facts = target.facts
    if facts.pad_between_seqs is False:
        return "pad_between_seqs=False was passed"
    if facts.pad_between_seqs is None and facts.padded_is_same_object:
        return "the same tensor object was passed as cu_seqlens and cu_seqlens_padded"
    metadata = per_step(ctx.stats(target.group, ctx.helpers_feeding(PADDED_PATH)))
    attention = ctx.category_launches(target.group, Category.ATTENTION)
    if (
        metadata == 0
        and attention > 0
        and facts.pad_between_seqs is None
        and (target.workload.implementation or "te").startswith("te")
    ):
        return "the trace shows attention but no get_cu_seqlens_on_cp_rank launches"
    return None


def _suggested_padded(target: Target) -> list[int] | None:
    seqlens = real_seqlens(target.facts, target.workload)
    if not seqlens:
        return None
    multiple = 2 * _cp(target)
    cu = [0]
    for s in seqlens:
        cu.append(cu[-1] + -(-s // multiple) * multiple)
    return cu


def fast_path_with_padding(ctx: RuleContext, target: Target) -> list[Finding]:
    """(b) Correctness: the unpadded fast path while the batch is really padded."""
    why = _fast_path(ctx, target)
    if why is None:
        return []
    differences = padding_differences(target.facts) or []
    tails = _tail_unaligned(target)
    if not differences and not tails:
        return []
    padded = target.facts.cu_seqlens_padded if differences else _suggested_padded(target)
    evidence = [Evidence(name="fast path because", value=why, window=target.group)]
    if differences:
        evidence.append(
            Evidence(name="padding", value="; ".join(differences[:4]), window=target.group)
        )
    if tails:
        evidence.append(
            Evidence(
                name=f"lengths not divisible by 2*cp={2 * _cp(target)}",
                value=str(tails),
                window=target.group,
            )
        )
    return [
        Finding(
            rule=FAST_PATH_WITH_PADDING,
            severity=Severity.ERROR,
            window=target.group,
            title=(
                f"Wrong attention in {target.label!r}: TE's unpadded P2P path runs on a padded "
                f"batch"
            ),
            evidence=evidence,
            references=["TE issue #3331", "NeMo-RL PR #4070"],
            recommendation=(
                f"Take the padded path: pass pad_between_seqs=True with cu_seqlens_q_padded/"
                f"cu_seqlens_kv_padded = {padded} as tensors distinct from cu_seqlens (each length "
                f"rounded up to a multiple of 2*cp={2 * _cp(target)}), or use {ADAPTER}. The "
                f"fast path "
                "computes per-step lengths as cu_seqlens // cp: real keys are dropped, real "
                "query rows "
                "are zeroed and gradients become nondeterministic."
            ),
        )
    ]


def zero_fill_without_padding(ctx: RuleContext, target: Target) -> list[Finding]:
    """(c) Gradient zero-fill launches although there is no padding to clear."""
    helpers = ctx.helpers_feeding(ZERO_FILL)
    stats = ctx.stats(target.group, helpers)
    if per_step(stats) == 0:
        return []
    differences = padding_differences(target.facts)
    if differences is None or differences or _tail_unaligned(target):
        return []  # padded (zero-fill is needed) or unknown (padded_path says what is missing)
    saving, pct, more = _saving(ctx, target, helpers)
    return [
        Finding(
            rule=ZERO_FILL,
            severity=Severity.WARNING,
            window=target.group,
            helper=", ".join(sorted({s.helper for s in stats})),
            ranks=sorted({s.rank for s in stats}),
            title=f"Backward zero-fills gradient padding in {target.label!r} but there is none",
            evidence=[*helper_evidence(stats, target.group), *more],
            recommendation=(
                "Nothing needs clearing: cu_seqlens_padded equals cu_seqlens. TE 2.20 runs "
                "_zero_thd_padding/get_thd_padding_mask on every THD backward (2.18-2.19: an "
                "inline "
                f"arange/compare/masked_fill block); use {ADAPTER} or the bundled cp_attn, which "
                "zero-fill only when the padded and unpadded cu_seqlens differ."
            ),
            expected_saving_ms=round(saving, 4),
            expected_saving_pct=None if pct is None else round(pct, 2),
        )
    ]


RULES = (padded_path, fast_path_with_padding, zero_fill_without_padding)
