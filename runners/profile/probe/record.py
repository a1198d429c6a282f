"""What the probe keeps: per wrapped function, call counts and per call signature the facts.

Only *sampled* calls are inspected (the first ``first`` calls, then one in ``every``); the rest
cost one counter increment. A signature is what decides TE's path (qkv_format, mask type, CP
size/comm/strategy); the facts are counted per signature so a report can say "value-equal clone
in 64 of 64 sampled calls". Everything here is plain data, dumped as JSON into
``probe_rank<r>.json`` and merged into the bundle manifest by ``runners/profile``.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ALIGNMENTS = (8, 16, 128)
"""Token multiples FP8 GEMMs care about (8: any FP8 GEMM, 16: some layouts, 128: blockwise)."""
MAX_DISTINCT_TOKENS = 32
"""Distinct token counts kept per signature (a dynamic-length job would otherwise grow forever)."""
PROBE_FORMAT = 1
DUMP_INTERVAL_S = 2.0
"""At most one record write per this many seconds at sampled calls (a new signature is written
at once; the exit dump writes the final counts)."""


@functools.cache
def transformer_engine_version() -> str | None:
    """The installed TE version, looked up once: a metadata scan costs milliseconds."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("transformer_engine", "transformer-engine"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


@dataclass(frozen=True, slots=True)
class SamplingPolicy:
    """First ``first`` calls, then every ``every``-th call (0 = never after the first ones)."""

    first: int = 16
    every: int = 50

    def sampled(self, index: int) -> bool:
        """Whether the ``index``-th call (1-based) is inspected."""
        if index <= self.first:
            return True
        return self.every > 0 and (index - self.first) % self.every == 0


def _key(value: object) -> str:
    """A JSON-friendly counter key (None, bools and enums spelled the way users write them)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return str(getattr(value, "value", value))


@dataclass(slots=True)
class CallFacts:
    """What one sampled call showed (values already on the host)."""

    cu_seqlens: list[int] | None = None
    cu_seqlens_padded: list[int] | None = None
    same_object: bool | None = None
    """``cu_seqlens_*_padded is cu_seqlens_*`` for q and kv (None: not observable here)."""
    value_equal: bool | None = None
    """Padded and unpadded offsets equal in every entry (q and kv)."""
    pad_between_seqs_passed: object = None
    pad_between_seqs_resolved: list[bool] = field(default_factory=list)
    """What TE computed and handed to its backend selection (empty: not observed)."""
    local_tokens: int | None = None
    cp_size: int = 1
    fp8_recipe: str | None = None
    """Recipe class in force (``"off"`` outside fp8_autocast; None: not observable)."""


def _zero_counts() -> dict[int, int]:
    return dict.fromkeys(ALIGNMENTS, 0)


@dataclass(slots=True)
class SignatureRecord:
    """Facts counted over the sampled calls of one signature."""

    signature: dict[str, Any]
    sampled_calls: int = 0
    same_object: Counter[str] = field(default_factory=Counter)
    value_equal: Counter[str] = field(default_factory=Counter)
    pad_between_seqs_passed: Counter[str] = field(default_factory=Counter)
    pad_between_seqs_resolved: Counter[str] = field(default_factory=Counter)
    seqlens_divisible_2cp: Counter[str] = field(default_factory=Counter)
    padded_seqlens_divisible_2cp: Counter[str] = field(default_factory=Counter)
    total_tokens: Counter[int] = field(default_factory=Counter)
    local_tokens_aligned: dict[int, int] = field(default_factory=lambda: _zero_counts())
    total_tokens_aligned: dict[int, int] = field(default_factory=lambda: _zero_counts())
    fp8_recipe: Counter[str] = field(default_factory=Counter)
    example: dict[str, Any] = field(default_factory=dict)

    def add(self, facts: CallFacts) -> None:
        self.sampled_calls += 1
        self.same_object[_key(facts.same_object)] += 1
        self.value_equal[_key(facts.value_equal)] += 1
        self.pad_between_seqs_passed[_key(facts.pad_between_seqs_passed)] += 1
        for resolved in facts.pad_between_seqs_resolved[:1]:  # the outermost decision
            self.pad_between_seqs_resolved[_key(resolved)] += 1
        self.fp8_recipe[_key(facts.fp8_recipe)] += 1
        two_cp = 2 * facts.cp_size
        for name, cu in (("seqlens_divisible_2cp", facts.cu_seqlens),
                         ("padded_seqlens_divisible_2cp", facts.cu_seqlens_padded)):
            if cu is not None:
                ok = all((b - a) % two_cp == 0 for a, b in itertools.pairwise(cu))
                getattr(self, name)[_key(ok)] += 1
        offsets = facts.cu_seqlens_padded or facts.cu_seqlens
        total = offsets[-1] if offsets else None
        if total is not None:
            if total in self.total_tokens or len(self.total_tokens) < MAX_DISTINCT_TOKENS:
                self.total_tokens[total] += 1
            for m in ALIGNMENTS:
                self.total_tokens_aligned[m] += total % m == 0
        if facts.local_tokens is not None:
            for m in ALIGNMENTS:
                self.local_tokens_aligned[m] += facts.local_tokens % m == 0
        if not self.example and facts.cu_seqlens is not None:
            self.example = {
                "cu_seqlens": facts.cu_seqlens,
                "cu_seqlens_padded": facts.cu_seqlens_padded,
                "local_tokens": facts.local_tokens,
            }

    def to_json(self) -> dict[str, Any]:
        return {
            "signature": self.signature,
            "sampled_calls": self.sampled_calls,
            "same_object": dict(self.same_object),
            "value_equal": dict(self.value_equal),
            "pad_between_seqs_passed": dict(self.pad_between_seqs_passed),
            "pad_between_seqs_resolved": dict(self.pad_between_seqs_resolved),
            "seqlens_divisible_2cp": dict(self.seqlens_divisible_2cp),
            "padded_seqlens_divisible_2cp": dict(self.padded_seqlens_divisible_2cp),
            "total_tokens": {str(k): v for k, v in sorted(self.total_tokens.items())},
            "total_tokens_aligned": {str(k): v for k, v in self.total_tokens_aligned.items()},
            "local_tokens_aligned": {str(k): v for k, v in self.local_tokens_aligned.items()},
            "fp8_recipe": dict(self.fp8_recipe),
            "example": self.example,
        }


@dataclass(slots=True)
class Site:
    """One wrapped function: how often it ran, and its sampled calls by signature."""

    name: str
    policy: SamplingPolicy
    calls: int = 0
    signatures: dict[tuple[Any, ...], SignatureRecord] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def tick(self) -> bool:
        """Count a call; return whether to inspect it (not locked: a lost count is harmless)."""
        self.calls += 1
        return self.policy.sampled(self.calls)

    def record(self, signature: dict[str, Any], facts: CallFacts) -> None:
        key = tuple(sorted((k, _key(v)) for k, v in signature.items()))
        rec = self.signatures.get(key)
        if rec is None:
            rec = self.signatures[key] = SignatureRecord(
                {k: None if v is None else _key(v) if not isinstance(v, int | bool) else v
                 for k, v in signature.items()}
            )
        rec.add(facts)

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "sampled_calls": sum(r.sampled_calls for r in self.signatures.values()),
            "signatures": [r.to_json() for r in self.signatures.values()],
            **self.extra,
        }


NO_CALL = "no TE or cp_attn call seen"
"""What a probe record says when the job never called a probed function (``sites`` empty)."""


def no_call_note(installed: list[str]) -> str:
    """The record's ``note`` for a process that called none of the probed functions."""
    where = (
        f"wrapped {', '.join(installed)}, never called"
        if installed
        else "neither Transformer Engine nor cp_attention was imported"
    )
    return f"{NO_CALL}: {where}; no metadata facts recorded"


@dataclass(slots=True)
class ProbeState:
    """Everything one process observed; written to ``probe_rank<r>.json``."""

    rank: int
    policy: SamplingPolicy
    out_dir: Path | None = None
    sites: dict[str, Site] = field(default_factory=dict)
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Calls recorded in full each time (setup calls: set_context_parallel_group, FSDP wraps)."""
    installed: list[str] = field(default_factory=list)
    """What the probe wrapped in this process (``module:attribute``)."""
    overhead_ns: int = 0
    """Time spent in the probe's own bookkeeping on sampled calls (measured), of which:"""
    host_copy_ns: int = 0
    """copying offsets to the host (a device-to-host copy waits for the stream's queued work)"""
    dump_ns: int = 0
    """and writing the record at sampled calls (see ``maybe_dump``)."""
    dump_interval_s: float = DUMP_INTERVAL_S
    last_dump: float | None = None
    dumped_signatures: int = -1
    errors: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Site -> ``{count, first}``: the probe's own failures. The probe never raises into the
    job; a fact it failed to read is reported as not observed instead."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def site(self, name: str) -> Site:
        site = self.sites.get(name)
        if site is None:
            site = self.sites.setdefault(name, Site(name, self.policy))
        return site

    def error(self, site: str, exc: BaseException) -> None:
        with self.lock:
            first = f"{type(exc).__name__}: {exc}"[:500]
            entry = self.errors.setdefault(site, {"count": 0, "first": first})
            entry["count"] += 1

    def event(self, name: str, record: dict[str, Any], *, limit: int = 64) -> None:
        with self.lock:
            items = self.events.setdefault(name, [])
            if len(items) < limit:
                items.append(record)

    def to_json(self) -> dict[str, Any]:
        return {
            "probe_format": PROBE_FORMAT,
            "rank": self.rank,
            "pid": os.getpid(),
            "sampling": {"first": self.policy.first, "every": self.policy.every},
            "transformer_engine": transformer_engine_version(),
            "installed": list(self.installed),
            "sites": {name: site.to_json() for name, site in sorted(self.sites.items())},
            "note": None if self.sites else no_call_note(self.installed),
            "events": self.events,
            "overhead_ms": round(self.overhead_ns / 1e6, 3),
            "host_copy_ms": round(self.host_copy_ns / 1e6, 3),
            "dump_ms": round(self.dump_ns / 1e6, 3),
            "errors": self.errors,
        }

    def maybe_dump(self) -> Path | None:
        """At a sampled call: write the record if it gained a signature since the last write or
        ``dump_interval_s`` passed (a rank killed later leaves a record at most that old; a
        clean or failing exit writes the final one). Its time counts in ``dump_ns``."""
        t0 = time.perf_counter_ns()
        signatures = sum(len(site.signatures) for site in self.sites.values())
        fresh = self.last_dump is not None and signatures == self.dumped_signatures and (
            time.monotonic() - self.last_dump < self.dump_interval_s
        )
        written = None if fresh else self.dump()
        self.dump_ns += time.perf_counter_ns() - t0
        return written

    def dump(self) -> Path | None:
        """Write the record atomically (a rank killed later still leaves its last dump)."""
        if self.out_dir is None:
            return None
        with self.lock:
            self.last_dump = time.monotonic()
            self.dumped_signatures = sum(len(site.signatures) for site in self.sites.values())
            text = json.dumps(self.to_json(), indent=1) + "\n"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        target = self.out_dir / f"probe_rank{self.rank}.json"
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
        return target
