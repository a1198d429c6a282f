"""How findings cite facts the in-process probe observed (``MetadataFacts.observed``).

A fact from the spec or a hand-written manifest is what the user *says* was passed; a fact from
``cptrace.probe`` is what the job *did*, counted over sampled calls. Findings built on probe
facts say so, with the counts ("value-equal clone in 64 of 64 sampled calls; TE resolved
pad_between_seqs=True"), and say which facts the probe could not observe, so a reader knows
which parts of the diagnosis are measured and which are inferred.
"""

from __future__ import annotations

from analyzers.findings.context import Target
from analyzers.manifest import ObservedFacts
from analyzers.report import Evidence


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
            Evidence(name=f"observed in the job by {observed.source} ({where})", value=text,
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
