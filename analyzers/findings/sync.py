"""Host synchronisation inside a step: the CPU waits for the GPU, so launches stop queueing."""

from __future__ import annotations

from analyzers.findings.context import RuleContext, Target, per_step_basis
from analyzers.report import UNATTRIBUTED, Evidence, Finding, Severity
from analyzers.windows import WHOLE_TRACE

HOST_SYNC = "host-sync-in-step"


def host_syncs(ctx: RuleContext, target: Target) -> list[Finding]:
    """(e) cudaStreamSynchronize / blocking copies / ``.item()`` inside the step windows."""
    if target.group == WHOLE_TRACE:
        return []  # between steps, a sync is harmless (timing, checkpointing)
    rows = [s for s in ctx.metrics.host_syncs if s.window == target.group and s.calls]
    out = []
    for helper in sorted({s.helper for s in rows}):
        mine = [s for s in rows if s.helper == helper]
        steps, basis = per_step_basis(target.group, mine[0].steps)
        per_rank = {s.rank: (s.calls / steps, s.blocked_ns / steps / 1e6) for s in mine}
        blocked = max(ms for _, ms in per_rank.values())
        known = helper != UNATTRIBUTED
        evidence = [
            Evidence(
                name=f"{mine[0].api} calls {basis}", value=round(c, 2), rank=r, window=target.group
            )
            for r, (c, _) in sorted(per_rank.items())
        ]
        evidence += [
            Evidence(
                name=f"host blocked {basis}",
                value=round(ms, 4),
                unit="ms",
                rank=r,
                window=target.group,
            )
            for r, (_, ms) in sorted(per_rank.items())
        ]
        where = f"inside {helper}" if known else "outside any catalogued helper"
        out.append(
            Finding(
                rule=HOST_SYNC,
                severity=Severity.WARNING if known else Severity.INFO,
                helper=helper if known else None,
                window=target.group,
                ranks=sorted(per_rank),
                evidence=evidence,
                title=f"The host waits for the GPU {where} in every {target.label!r} step",
                recommendation=(
                    "Compute packed-batch metadata (per-rank indices, cu_seqlens per CP step) "
                    "on the host "
                    "once per batch from values you already have "
                    "(cp_attention.PackedBatch.from_cu_seqlens) "
                    "instead of .item()/.tolist()/nonzero/torch.cuda.synchronize inside the "
                    "step; a sync "
                    "drains the launch queue and exposes every later launch's latency."
                    if known
                    else "Check whether this synchronisation is part of the measured step (a "
                    "timing harness "
                    "or logging .item()); move it outside the step or make it asynchronous."
                ),
                # the host's blocked time inside the step: an upper-side estimate (part of the
                # wait would move to the next sync point or the step's end)
                expected_saving_ms=round(blocked, 4) if known else None,
                saving_basis="estimate" if known else None,
            )
        )
    return out


RULES = (host_syncs,)
