"""How findings cite facts the in-process probe observed (``MetadataFacts.observed``).

A fact from the spec or a hand-written manifest is what the user *says* was passed; a fact from
``cptrace.probe`` is what the job *did*, counted over sampled calls. Findings built on probe
facts say so, with the counts ("value-equal clone in 64 of 64 sampled calls; TE resolved
pad_between_seqs=True"), and say which facts the probe could not observe, so a reader knows
which parts of the diagnosis are measured and which are inferred. When no finding rests on
the observed facts (a run without CP, FP8 or FSDP breaks none of the rules), the report's notes
still say what the probe observed and why no rule judged it (``uncited_observations``).
"""

from __future__ import annotations

from analyzers.findings.context import Target
from analyzers.manifest import ObservedFacts, RunManifest
from analyzers.report import Evidence, Finding

OBSERVED_EVIDENCE = "observed in the job by"


def _decisions(counts: dict[str, int]) -> str:
    return ", ".join(f"{value} in {n}" for value, n in sorted(counts.items()))


def metadata_sentence(observed: ObservedFacts) -> str:
    """Identity/equality and the padding decision, as counted by the probe."""
    n = observed.sampled_calls
    parts = []
    same, equal = observed.same_object_calls, observed.value_equal_calls
    if same is not None and equal is not None:
        if same == 0 and equal == n:
            parts.append(f"value-equal clone in {equal} of {n} sampled calls")
        elif same == n:
            parts.append(f"the same tensor object in {n} of {n} sampled calls")
        else:
            parts.append(
                f"same object in {same}, equal in every entry in {equal} of {n} sampled calls"
            )
    elif equal is not None:
        parts.append(f"cu_seqlens_padded equal to cu_seqlens in {equal} of {n} sampled calls")
    resolved = observed.pad_between_seqs_resolved
    if observed.function and observed.function.startswith("transformer_engine"):
        if len(resolved) == 1:
            value, count = next(iter(resolved.items()))
            parts.append(f"TE resolved pad_between_seqs={value.capitalize()} ({count} calls)")
        elif resolved:
            parts.append(f"TE resolved pad_between_seqs as {_decisions(resolved)} calls")
    elif len(resolved) == 1:
        value = next(iter(resolved))
        parts.append(f"cp_attn decided has_padding={value.capitalize()}")
    return "; ".join(parts)


def tokens_sentence(observed: ObservedFacts) -> str:
    """Per-rank token alignment and the FP8/FSDP setup, as counted by the probe."""
    n = observed.sampled_calls
    aligned = ", ".join(
        f"multiple of {m} in {count} of {n}" for m, count in observed.local_tokens_aligned.items()
    )
    parts = [f"per-rank token count {aligned} sampled calls"] if aligned else []
    if observed.fp8_recipes:
        parts.append(f"FP8 recipe {', '.join(observed.fp8_recipes)}")
    if observed.fsdp:
        parts.append(f"FSDP via {', '.join(observed.fsdp)}")
    return "; ".join(parts)


def observed_evidence(target: Target, *, about: str) -> list[Evidence]:
    """Evidence lines for a finding built on probe facts (none when the facts were declared).

    ``about``: ``"metadata"`` (padding rules) or ``"tokens"`` (alignment, divisibility).
    """
    observed = target.facts.observed
    if observed is None:
        return []
    text = metadata_sentence(observed) if about == "metadata" else tokens_sentence(observed)
    where = observed.function
    if observed.ranks:
        where = f"{observed.function} on ranks {observed.ranks}"
    out = []
    if text:
        out.append(
            Evidence(name=f"{OBSERVED_EVIDENCE} {observed.source} ({where})", value=text,
                     window=target.group)
        )
    if observed.not_observed:
        out.append(
            Evidence(name="not observed", value="; ".join(observed.not_observed),
                     window=target.group)
        )
    return out


def observed_prefix(target: Target, *, about: str) -> str:
    """``"Observed: ...; "`` to open a recommendation with, or ``""`` for declared facts."""
    observed = target.facts.observed
    if observed is None:
        return ""
    text = metadata_sentence(observed) if about == "metadata" else tokens_sentence(observed)
    return f"Observed in the job: {text}. " if text else ""


def _cites_probe(finding: Finding) -> bool:
    return any(e.name.startswith(OBSERVED_EVIDENCE) for e in finding.evidence)


def _why_no_rule(cp_size: int, fp8: bool, fsdp: bool) -> str:
    reasons = []
    if cp_size < 2:
        reasons.append("CP size 1 (the padded-path and 2*cp divisibility rules judge CP runs)")
    if not (fp8 or fsdp):
        reasons.append("neither FP8 nor FSDP (token alignment is judged under those)")
    return f": {' and '.join(reasons)}" if reasons else ""


def uncited_observations(manifest: RunManifest | None, findings: list[Finding]) -> list[str]:
    """Report notes for probe-observed facts that no finding cites: what was observed, why no
    rule judged it, and what the probe could not observe."""
    if manifest is None:
        return []
    notes = []
    for variant in manifest.variants:
        observed = variant.facts.observed
        if observed is None:
            continue
        cited = [
            f for f in findings
            if _cites_probe(f) and (variant.window is None or f.window == variant.window)
        ]
        if cited:
            continue
        seen = "; ".join(
            s for s in (metadata_sentence(observed), tokens_sentence(observed)) if s
        )
        where = f"{observed.function} on ranks {observed.ranks}" if observed.ranks else (
            observed.function or "no entry point"
        )
        te = f", TE {observed.transformer_engine}" if observed.transformer_engine else ""
        workload = manifest.effective_workload(variant)
        note = (
            f"{observed.source} observed in the job ({variant.name!r}: {where}, "
            f"{observed.sampled_calls} of {observed.calls} calls sampled{te}): "
            f"{seen or 'no fact the rules use'}. No finding rests on these facts"
            + _why_no_rule(workload.cp_size or 1, variant.facts.fp8, variant.facts.fsdp)
            + "."
        )
        if observed.not_observed:
            note += f" Not observed: {'; '.join(observed.not_observed)}."
        notes.append(note)
    return notes
