"""Rules about TE's padding detector: the slow padded path, the wrong fast path, needless zero-fill.

Background (DESIGN problem 1): TE >= 2.18 with ``pad_between_seqs=None`` decides "padded" by
object identity, so value-equal clones take the padded path (``get_cu_seqlens_on_cp_rank`` twice
per CP step, gradient zero-fill). The opposite mistake, the fast path while real padding exists
(including a tail pad making a length divisible by 2*cp), silently corrupts attention under P2P
CP (TE issue #3331). The trace shows which path ran; only the manifest can show the values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from analyzers.catalog import Catalog
from analyzers.findings.context import (
    RuleContext,
    Target,
    expected_saving,
    padding_differences,
    real_seqlens,
)
from analyzers.findings.observed import observed_evidence, observed_prefix
from analyzers.report import (
    AccountPartKind,
    Category,
    Evidence,
    Finding,
    GroupAccount,
    Severity,
)
from analyzers.windows import WHOLE_TRACE

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


def _implementation(target: Target) -> str:
    """ "te", "te-adapter" or "bundled" (unknown counts as TE: the rules were written for it)."""
    return (target.workload.implementation or "te").replace("_", "-")


def _forced(target: Target, flag: str) -> bool:
    """Whether the bundled implementation was told to reproduce TE's behaviour (``broken_*``)."""
    extra = target.workload.model_extra or {}
    return bool(extra.get(flag))


def _saving_fields(saving: Any) -> dict[str, Any]:
    return {
        "expected_saving_ms": None if saving.ms is None else round(saving.ms, 4),
        "expected_saving_pct": None if saving.pct is None else round(saving.pct, 2),
        "saving_basis": saving.basis,
    }


def padded_path(ctx: RuleContext, target: Target) -> list[Finding]:
    """(a) TE's padded path although every cu_seqlens entry equals its padded twin."""
    helpers = ctx.helpers_feeding(PADDED_PATH)
    if not ctx.ran(target.group, helpers):
        return []
    evidence = ctx.usage_evidence(target.group, helpers)
    differences = padding_differences(target.facts)
    base: dict[str, Any] = {
        "helper": ctx.names_running(target.group, helpers),
        "window": target.group,
        "ranks": ctx.ranks_running(target.group, helpers),
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
                    *observed_evidence(target, about="metadata"),
                ],
                title=f"Padded THD path in {target.label!r} is required: the batch is padded",
                recommendation=(
                    observed_prefix(target, about="metadata")
                    + "Keep the padded path (pad_between_seqs=True or distinct padded cu_seqlens); "
                    "do not pass pad_between_seqs=False here."
                ),
                **base,
            )
        ]
    saving = expected_saving(ctx, target, helpers)
    if _implementation(target) == "bundled":
        who = "The bundled cp_attn ran the padded THD path"
        recommendation = (
            "cu_seqlens_padded equals cu_seqlens in every entry (the last included); cp_attn "
            "decides padding from values and skips the per-step metadata kernels, unless it is "
            "told to reproduce TE's identity check (broken_identity_padding"
            + (", set in this arm" if _forced(target, "broken_identity_padding") else "")
            + "): turn that off."
        )
    else:
        who = "TE ran the padded THD path"
        recommendation = (
            "cu_seqlens_padded equals cu_seqlens in every entry (the last included), so pass "
            "pad_between_seqs=False to DotProductAttention.forward, or pass the same "
            "tensor object "
            f"for cu_seqlens_q_padded/cu_seqlens_kv_padded, or use {ADAPTER}, which "
            f"decides from values."
        )
    return [
        Finding(
            rule=PADDED_PATH,
            severity=Severity.WARNING,
            evidence=[
                *evidence,
                *saving.evidence,
                Evidence(
                    name="cu_seqlens == cu_seqlens_padded in every entry",
                    value=True,
                    window=target.group,
                ),
                *observed_evidence(target, about="metadata"),
            ],
            title=f"{who} in {target.label!r} although nothing is padded",
            recommendation=observed_prefix(target, about="metadata") + recommendation,
            **_saving_fields(saving),
            **base,
        )
    ]


def _fast_path(ctx: RuleContext, target: Target) -> str | None:
    """Why this group took TE's unpadded P2P path, or None."""
    facts = target.facts
    if _implementation(target) == "bundled":
        return None  # cp_attn decides from values; it has no unpadded-path shortcut to misuse
    if facts.pad_between_seqs is False:
        return "pad_between_seqs=False was passed"
    if facts.pad_between_seqs is None and facts.padded_is_same_object:
        return "the same tensor object was passed as cu_seqlens and cu_seqlens_padded"
    metadata = ctx.ran(target.group, ctx.helpers_feeding(PADDED_PATH))
    attention = ctx.category_ran(target.group, Category.ATTENTION)
    if (
        not metadata
        and attention
        and facts.pad_between_seqs is None
        and (target.workload.implementation or "te").startswith("te")
        # Without CP there is no per-step metadata to miss: its absence proves nothing (a
        # one-GPU te_transformer run with padded offsets was flagged before this).
        and _cp(target) >= 2
    ):
        seen = "launches" if ctx.gpu_observed else "calls (host ranges)"
        return f"the trace shows attention but no get_cu_seqlens_on_cp_rank {seen}"
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
    evidence = [
        Evidence(name="fast path because", value=why, window=target.group),
        *observed_evidence(target, about="metadata"),
    ]
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
            recommendation=observed_prefix(target, about="metadata") + (
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
    if not ctx.ran(target.group, helpers):
        return []
    differences = padding_differences(target.facts)
    if differences is None or differences or _tail_unaligned(target):
        return []  # padded (zero-fill is needed) or unknown (padded_path says what is missing)
    saving = expected_saving(ctx, target, helpers)
    return [
        Finding(
            rule=ZERO_FILL,
            severity=Severity.WARNING,
            window=target.group,
            helper=ctx.names_running(target.group, helpers),
            ranks=ctx.ranks_running(target.group, helpers),
            title=f"Backward zero-fills gradient padding in {target.label!r} but there is none",
            evidence=[
                *ctx.usage_evidence(target.group, helpers),
                *_zero_fill_elsewhere(ctx, target, helpers),
                *saving.evidence,
                *observed_evidence(target, about="metadata"),
            ],
            recommendation=_zero_fill_recommendation(ctx, target, helpers),
            **_saving_fields(saving),
        )
    ]


def _fast_path_arms(ctx: RuleContext, target: Target, helpers: list[str]) -> list[str]:
    """TE arms of this run that took the unpadded path (or used the adapter) and still
    zero-filled: proof that the TE version zero-fills unconditionally."""
    out = []
    for other in ctx.targets():
        if _implementation(other) == "bundled" or other.label in out:
            continue
        unpadded = (
            other.facts.pad_between_seqs is False
            or (other.facts.pad_between_seqs is None and other.facts.padded_is_same_object)
            or _implementation(other) == "te-adapter"
        )
        if unpadded and ctx.ran(other.group, helpers):
            out.append(other.label)
    return out


def _zero_fill_elsewhere(ctx: RuleContext, target: Target, helpers: list[str]) -> list[Evidence]:
    arms = _fast_path_arms(ctx, target, helpers)
    if not arms or _implementation(target) == "bundled":
        return []
    return [
        Evidence(
            name="arms of this run on TE's unpadded path that zero-fill too",
            value=", ".join(arms),
            window=target.group,
        )
    ]


def _zero_fill_recommendation(ctx: RuleContext, target: Target, helpers: list[str]) -> str:
    implementation = _implementation(target)
    if implementation == "bundled":
        return (
            "Nothing needs clearing: cu_seqlens_padded equals cu_seqlens. cp_attn zero-fills "
            "gradient padding only when the padded and unpadded cu_seqlens differ, unless it is "
            "told to reproduce TE's unconditional zero-fill (broken_always_zero_fill"
            + (", set in this arm" if _forced(target, "broken_always_zero_fill") else "")
            + "): turn that off."
        )
    arms = _fast_path_arms(ctx, target, helpers)
    proof = (
        f" (this run's arms {', '.join(repr(a) for a in arms)} take the unpadded path and still "
        f"zero-fill)"
        if arms
        else ""
    )
    return (
        "Nothing needs clearing: cu_seqlens_padded equals cu_seqlens. TE 2.20 runs "
        "_zero_thd_padding/get_thd_padding_mask on every THD backward (2.18-2.19: an inline "
        "arange/compare/masked_fill block) whatever pad_between_seqs says, so neither "
        f"pad_between_seqs=False, the same tensor object nor {ADAPTER} removes it{proof}. "
        "Use the bundled cp_attn (implementation 'bundled'), which zero-fills only when the "
        "padded and unpadded cu_seqlens differ, or skip the zero-fill in TE when they are equal."
    )


RULES = (padded_path, fast_path_with_padding, zero_fill_without_padding)


def idle_statement(
    findings: list[Finding], accounts: Sequence[GroupAccount], catalog: Catalog
) -> list[Finding]:
    """The padded-path finding, with how long the GPU sat idle because of the helper.

    Measured by the step account (``analyzers.account``): host-bound idle time attributed to
    the helpers feeding this rule, per step of the finding's window, per rank. It goes next to
    the finding's measured iteration difference against a sibling arm (already in its
    evidence when the run has one); the title names the slowest rank's figure.
    """
    helpers = {h.name for h in catalog.helpers if h.finding == PADDED_PATH}
    out = []
    for finding in findings:
        if finding.rule != PADDED_PATH or finding.window is None:
            out.append(finding)
            continue
        mine = [g for g in accounts if g.window == finding.window]
        # whole-trace totals stay totals: "per step" only where the figure is one
        whole = finding.window == WHOLE_TRACE
        per = "in the whole trace" if whole else "per step"
        per_rank = {
            g.rank: sum(
                p.time_ns
                for p in g.parts
                if p.part == AccountPartKind.IDLE_HOST and p.label in helpers
            )
            / (1 if whole else max(g.steps, 1))
            / 1e6
            for g in mine
        }
        if not per_rank or max(per_rank.values()) <= 0:
            out.append(finding)
            continue
        names = ", ".join(sorted(helpers & {finding.helper or ""}) or sorted(helpers))
        evidence = [
            Evidence(
                name=f"GPU idle {per} because of {names} on the host",
                value=round(ms, 4),
                unit="ms",
                rank=rank,
                window=finding.window,
            )
            for rank, ms in sorted(per_rank.items())
        ]
        worst = max(per_rank.values())
        out.append(
            finding.model_copy(
                update={
                    "title": f"{finding.title}: the GPU was idle {worst:.2f} ms {per} "
                    f"because of {names} on the host",
                    "evidence": [*finding.evidence, *evidence],
                }
            )
        )
    return out
