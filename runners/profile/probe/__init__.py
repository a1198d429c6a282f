"""``runners.profile.probe``: facts from inside the training process, without changing its code.

A trace shows which kernels ran; it cannot show whether ``cu_seqlens_q_padded`` was the same
object as ``cu_seqlens_q``, equal to it in every entry, what ``pad_between_seqs`` TE resolved,
or how many tokens reached the FP8 GEMMs. The probe wraps, when they are imported, TE's
``DotProductAttention.forward`` / ``set_context_parallel_group`` / ``get_batch_on_this_cp_rank``,
the bundled ``cp_attention.cp_attn`` and FSDP's wrappers, and records those facts per call
signature on sampled calls (``first`` calls, then one in ``every``).

Enable it with ``cptrace profile --probe -- CMD`` (the bootstrap calls :func:`install` in every
rank), or in code::

    from runners.profile import probe
    probe.install(out_dir="probe", rank=0)   # before or after importing TE

Each process writes ``probe_rank<r>.json`` into ``out_dir`` at every sampled call and at exit;
``runners/profile`` merges them into the bundle manifest (``probe`` and the variant's facts;
the facts' ``source`` is ``"cptrace.probe"``, the name manifests and findings give the probe).
It lives on the runners' side: ``runners.profile`` loads it in every rank, and the CLI
(``cptrace profile --probe``) only turns it on.
"""

from __future__ import annotations

import atexit
import json
import os
from pathlib import Path

from runners.profile.probe.record import ProbeState, SamplingPolicy
from runners.profile.probe.wrappers import fp8_recipe_in_force, install_wrappers

PROBE_ENV = "CPTRACE_PROBE"
"""JSON ``{"out_dir": ..., "first": 16, "every": 50}``: set by ``cptrace profile --probe``."""

_STATE: ProbeState | None = None


def rank_from_environment() -> int:
    """This process's rank as the launcher set it (torchrun, Slurm, Open MPI); 0 when alone."""
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def install(
    out_dir: str | Path | None = None,
    *,
    rank: int | None = None,
    first: int = 16,
    every: int = 50,
) -> ProbeState:
    """Wrap the probe's targets in this process (idempotent); return the live record."""
    global _STATE
    if _STATE is not None:
        return _STATE
    if first < 0 or every < 0:
        raise ValueError(f"probe sampling: first ({first}) and every ({every}) must be >= 0")
    state = ProbeState(
        rank=rank_from_environment() if rank is None else rank,
        policy=SamplingPolicy(first=first, every=every),
        out_dir=None if out_dir is None else Path(out_dir),
    )
    _STATE = state
    install_wrappers(state)
    atexit.register(state.dump)
    return state


def install_from_environment() -> ProbeState | None:
    """:func:`install` with the settings in ``$CPTRACE_PROBE``; None when it is unset."""
    raw = os.environ.get(PROBE_ENV)
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"${PROBE_ENV}: not JSON ({exc}): {raw[:80]!r}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"${PROBE_ENV}: expected a JSON object, got {raw[:80]!r}")
    return install(cfg.get("out_dir"), first=int(cfg.get("first", 16)),
                   every=int(cfg.get("every", 50)))


def state() -> ProbeState | None:
    """The probe's record in this process (None before :func:`install`)."""
    return _STATE


__all__ = [
    "PROBE_ENV",
    "ProbeState",
    "SamplingPolicy",
    "fp8_recipe_in_force",
    "install",
    "install_from_environment",
    "rank_from_environment",
    "state",
]
