"""Findings: rules that turn metrics plus the run manifest into diagnoses with a recommendation.

One module per rule group: ``padding`` (TE's padding detector, both directions, and needless
zero-fill), ``workload`` (token alignment, 2*cp divisibility, causal balance), ``sync`` (host
syncs in the step). Each rule takes a :class:`RuleContext` and a :class:`Target` (one window
group and the manifest facts describing it) and returns zero or more findings; rules never
raise on missing facts, they say which facts they need.
"""

from __future__ import annotations

from collections.abc import Sequence

from analyzers.catalog import Catalog, load_catalog
from analyzers.findings import padding, sync, workload
from analyzers.findings.context import RuleContext, Target
from analyzers.manifest import RunManifest
from analyzers.metrics import Metrics
from analyzers.report import Finding, IterationStats, Severity

RULES = (*padding.RULES, *sync.RULES, *workload.RULES)
_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


def evaluate(
    metrics: Metrics,
    manifest: RunManifest | None,
    *,
    catalog: Catalog | None = None,
    iterations: Sequence[IterationStats] = (),
) -> list[Finding]:
    """Run every rule on every target; errors first, then warnings, then info."""
    ctx = RuleContext(metrics, manifest, catalog or load_catalog(use_env=False), iterations)
    findings = [
        finding for target in ctx.targets() for rule in RULES for finding in rule(ctx, target)
    ]
    return sorted(findings, key=lambda f: _ORDER[f.severity])


__all__ = ["RULES", "RuleContext", "Target", "evaluate"]
