"""Probe records (``probe_rank<r>.json``) -> the manifest's workload, variant facts and ``probe``.

Facts the trace analyzers use (``analyzers/manifest.py``: ``MetadataFacts`` and its ``observed``
counts) are taken from the signature the probe saw most often on the lowest rank that has
one; the full per-rank records go under the manifest's ``probe`` key for anyone who wants more.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from runners.profile.probe.wrappers import CP_ATTN_SITE, DPA_SITE
from runners.profile.supervise import read_rank_records

_SITES = (DPA_SITE, CP_ATTN_SITE)  # attention entry points, most specific first
_COMM = {"p2p": "p2p", "all_gather": "all_gather", "a2a": "a2a"}


def read_probe_files(directory: Path) -> dict[int, dict[str, Any]]:
    """rank -> probe record (files that cannot be read are skipped: a rank killed mid-write)."""
    return read_rank_records(directory, "probe_rank*.json")


def _true(counter: dict[str, int]) -> int:
    return int(counter.get("true", 0))


def _unanimous(counter: dict[str, int]) -> Any:
    """The single value every sampled call had (decoded from JSON), else None."""
    if len(counter) != 1:
        return None
    return json.loads(next(iter(counter))) if next(iter(counter)) in ("true", "false", "null") \
        else next(iter(counter))


def _dominant(records: dict[int, dict[str, Any]]) -> tuple[str, dict[str, Any], list[int]] | None:
    """(site, signature record, ranks having that signature) of the most sampled signature."""
    for site in _SITES:
        for rank in sorted(records):
            sigs = records[rank].get("sites", {}).get(site, {}).get("signatures", [])
            if sigs:
                best = max(sigs, key=lambda s: s["sampled_calls"])
                ranks = [
                    r for r in sorted(records)
                    if any(s["signature"] == best["signature"]
                           for s in records[r].get("sites", {}).get(site, {}).get("signatures", []))
                ]
                return site, best, ranks
    return None


def observed_facts(records: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """``MetadataFacts`` (with ``observed``) and the workload fields for the manifest."""
    found = _dominant(records)
    if found is None:
        return None
    site, sig, ranks = found
    rank_record = records[ranks[0]]
    site_record = rank_record["sites"][site]
    example = sig.get("example") or {}
    cu, cup = example.get("cu_seqlens"), example.get("cu_seqlens_padded")
    signature = sig["signature"]
    fsdp = sorted(
        {e["kind"] for r in records.values() for e in r.get("events", {}).get("fsdp", [])}
    )
    recipes = sorted(k for k in sig.get("fp8_recipe", {}) if k not in ("null", "off"))
    same = sig.get("same_object", {})
    not_observed = []
    if "null" in same:
        not_observed.append("object identity of cu_seqlens_padded (the call takes values)")
    if not sig.get("pad_between_seqs_resolved"):
        not_observed.append("pad_between_seqs as TE resolved it")
    if "null" in sig.get("fp8_recipe", {}):
        not_observed.append("FP8 recipe (Transformer Engine not loaded)")
    for r in sorted(records):
        for where, err in (records[r].get("errors") or {}).items():
            not_observed.append(
                f"rank {r}: the probe could not read {where} ({err['count']} calls): {err['first']}"
            )
    tokens = sig.get("total_tokens") or {}
    total = int(max(tokens, key=lambda k: tokens[k])) if tokens else None
    observed = {
        "source": "cptrace.probe",
        "function": site,
        "ranks": ranks,
        "calls": site_record.get("calls", 0),
        "sampled_calls": sig["sampled_calls"],
        "same_object_calls": None if "null" in same else _true(same),
        "value_equal_calls": _true(sig.get("value_equal", {})),
        "pad_between_seqs_passed": sig.get("pad_between_seqs_passed", {}),
        "pad_between_seqs_resolved": sig.get("pad_between_seqs_resolved", {}),
        "seqlens_divisible_2cp_calls": _true(sig.get("seqlens_divisible_2cp", {})),
        "local_tokens_aligned": sig.get("local_tokens_aligned", {}),
        "total_tokens_seen": tokens,
        "fp8_recipes": recipes,
        "fsdp": fsdp,
        "transformer_engine": rank_record.get("transformer_engine"),
        "sampling": rank_record.get("sampling"),
        "not_observed": not_observed,
    }
    same_value = _unanimous(same)
    facts = {
        "cu_seqlens": cu,
        "cu_seqlens_padded": cup,
        "padded_is_same_object": same_value if isinstance(same_value, bool) else None,
        "pad_between_seqs": _unanimous(sig.get("pad_between_seqs_passed", {})),
        "total_tokens": total,
        "fp8": bool(recipes),
        "fsdp": bool(fsdp),
        "observed": observed,
    }
    if not isinstance(facts["pad_between_seqs"], bool):
        facts["pad_between_seqs"] = None
    mask = str(signature.get("attn_mask_type") or "")
    comm = signature.get("cp_comm_type")
    workload = {
        "implementation": "te" if site == DPA_SITE else "bundled",
        "cp_size": signature.get("cp_size") or 1,
        "cp_comm": _COMM.get(str(comm)) if comm else None,
        "strategy": signature.get("load_balancing_strategy"),
        "causal": "causal" in mask if mask else None,
        "seqlens": [b - a for a, b in itertools.pairwise(cu)] if cu else None,
        "qkv_format": signature.get("qkv_format"),
        "cp_comm_type": comm,
    }
    if workload["strategy"] not in (None, "dual_chunk_swap", "no_load_balance"):
        workload["strategy"] = None
    return {"facts": facts, "workload": workload}
