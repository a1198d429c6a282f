"""Host synchronisation inside a step: the CPU waits for the GPU, so launches stop queueing."""

from __future__ import annotations

from analyzers.findings.context import NOT_OBSERVED, RuleContext, Target, per_step_basis
from analyzers.report import UNATTRIBUTED, Evidence, Finding, HostSyncStat, Severity
from analyzers.windows import WHOLE_TRACE

HOST_SYNC = "host-sync-in-step"


def host_syncs(ctx: RuleContext, target: Target) -> list[Finding]:
    """(e) cudaStreamSynchronize / blocking copies / ``.item()`` inside the step windows."""
    if target.group == WHOLE_TRACE:
        return []  # between steps, a sync is harmless (timing, checkpointing)
    if not ctx.gpu_observed:
        return _sync_ops_without_gpu(ctx, target)
    rows = [s for s in ctx.metrics.host_syncs if s.window == target.group and s.calls]
    out = []
    for helper in sorted({s.helper for s in rows}):
        mine = [s for s in rows if s.helper == helper]
        steps, basis = per_step_basis(target.group, mine[0].steps)
        per_rank = {s.rank: (s.calls / steps, s.blocked_ns / steps / 1e6) for s in mine}
        blocked = max(ms for _, ms in per_rank.values())
        known = helper != UNATTRIBUTED
        evidence = _kind_evidence(mine, steps, basis, target.group)
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


def _kind_evidence(
    mine: list[HostSyncStat], steps: int, basis: str, group: str
) -> list[Evidence]:
    """Blocking calls per API kind and host-sync operator calls per operator, counted apart
    (five ``.item()`` ops can make twenty blocking CUDA calls: neither count names the other).
    A row from a report without the split falls back to its one label."""
    out = []
    for s in sorted(mine, key=lambda s: s.rank):
        apis = s.apis or {s.api: s.calls}
        out += [
            Evidence(
                name=f"blocking {api} calls {basis}",
                value=round(n / steps, 2),
                rank=s.rank,
                window=group,
            )
            for api, n in apis.items()
        ]
        out += [
            Evidence(
                name=f"{op} calls that blocked {basis}",
                value=round(n / steps, 2),
                rank=s.rank,
                window=group,
            )
            for op, n in s.ops.items()
        ]
    return out


def _sync_ops_without_gpu(ctx: RuleContext, target: Target) -> list[Finding]:
    """A trace without GPU activity has no sync API calls to time, but its ranges still show
    which helper calls a host-sync operator (``aten::item``, ``aten::nonzero``, ...) in the step
    and how often: on a GPU tensor each one waits for the device. The blocked time is not
    observed, so these are observations (info), never a saving."""
    feeding = set(ctx.helpers_feeding(HOST_SYNC))
    rows = [
        r
        for r in (ctx.host_time.helpers if ctx.host_time else [])
        if r.window == target.group and r.calls and (r.sync_ops or r.helper in feeding)
    ]
    out = []
    for helper in sorted({r.helper for r in rows}):
        mine = sorted((r for r in rows if r.helper == helper), key=lambda r: r.rank)
        steps, basis = per_step_basis(target.group, mine[0].steps)
        evidence = [
            item
            for r in mine
            for item in (
                Evidence(
                    name=f"host-sync operators inside {helper} {basis} (host ranges)",
                    value=round(r.sync_ops / steps, 2),
                    rank=r.rank,
                    window=target.group,
                ),
                Evidence(
                    name=f"calls of {helper} {basis} (host ranges)",
                    value=round(r.calls / steps, 2),
                    rank=r.rank,
                    window=target.group,
                ),
            )
        ]
        evidence.append(
            Evidence(name="host time blocked on the GPU", value=NOT_OBSERVED, window=target.group)
        )
        most = max(r.sync_ops / steps for r in mine)
        what = (
            f"calls host-sync operators ({most:g} per step)"
            if most
            else "ran (no host-sync operator recorded inside it)"
        )
        out.append(
            Finding(
                rule=HOST_SYNC,
                severity=Severity.INFO,
                helper=helper,
                window=target.group,
                ranks=[r.rank for r in mine],
                evidence=evidence,
                title=f"{helper} {what} in {target.label!r}; the trace has no GPU activity, so "
                "the time they would block the host is not observed",
                recommendation=(
                    "On a GPU every .item()/.tolist()/nonzero on a device tensor inside the step "
                    "drains the launch queue: compute the metadata on the host once per batch "
                    "(cp_attention.PackedBatch.from_cu_seqlens), and profile a GPU run of the "
                    "same workload to measure the blocked time."
                ),
            )
        )
    return out


RULES = (host_syncs,)
