"""Findings: rules that turn metrics plus the run manifest into diagnoses with a recommendation.

One module per rule group: ``padding`` (TE's padding detector, both directions, and needless
zero-fill), ``workload`` (token alignment, 2*cp divisibility, causal balance), ``sync`` (host
syncs in the step). Each rule takes a :class:`RuleContext` and a :class:`Target` (one window
group and the manifest facts describing it) and returns zero or more findings; rules never
raise on missing facts, they say which facts they need. On a trace without GPU activity the
rules judge from the host ranges (``RuleContext.host_time``) and ``no_gpu`` says "not observed"
for what needs the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from analyzers.catalog import Catalog, load_catalog
from analyzers.findings import no_gpu, padding, sync, workload
from analyzers.findings.context import RuleContext, Target
from analyzers.manifest import RunManifest
from analyzers.metrics import Metrics
from analyzers.report import Finding, HostTimeReport, IterationStats, Severity

RULES = (*padding.RULES, *sync.RULES, *workload.RULES)
_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


def evaluate(
    metrics: Metrics,
    manifest: RunManifest | None,
    *,
    catalog: Catalog | None = None,
    iterations: Sequence[IterationStats] = (),
    host_time: HostTimeReport | None = None,
) -> list[Finding]:
    """Run every rule on every target; errors first, then warnings, then info.

    ``host_time``: the host figures from the ranges; when it says the trace has no GPU activity
    the rules use them, and one finding lists the GPU evidence that was not observed."""
    ctx = RuleContext(
        metrics, manifest, catalog or load_catalog(use_env=False), iterations, host_time
    )
    findings = [
        finding for target in ctx.targets() for rule in RULES for finding in rule(ctx, target)
    ]
    findings += no_gpu.not_observed(ctx)
    return sorted(findings, key=lambda f: _ORDER[f.severity])


__all__ = ["RULES", "RuleContext", "Target", "evaluate"]
