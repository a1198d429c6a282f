"""What a trace without GPU activity cannot show, said once instead of left to silence.

A CPU run (gloo), a CPU-only profile or an nsys export without CUPTI tables still has its
ranges, so the padding, zero-fill and host-sync rules judge from the helpers' host calls
(``RuleContext.host_time``). Some checks need GPU evidence no range can give: this finding
names each of them with "not observed: no GPU activity in this trace".
"""

from __future__ import annotations

from analyzers.findings.context import NOT_OBSERVED, RuleContext
from analyzers.report import Evidence, Finding, Severity

GPU_NOT_OBSERVED = "gpu-not-observed"

NEEDS_GPU = (
    (
        "padded-path-without-padding, zero-fill-without-padding",
        "the helpers' kernels, GPU time and the expected saving (their calls and host time are "
        "reported from the ranges)",
    ),
    ("causal-imbalance", "attention GPU time per rank (the measured imbalance)"),
    ("host-sync-in-step", "host time blocked on the GPU (sync operators are counted)"),
    ("GPU timeline, where the step went", "busy, computation, exposed communication, idle gaps"),
)
"""(rule or figure, the GPU evidence it needs)."""


def not_observed(ctx: RuleContext) -> list[Finding]:
    """One info finding listing the GPU-based checks, when the trace has no GPU activity but
    shows catalogued helpers on the host (an empty trace has nothing to judge: its note says
    so)."""
    if ctx.gpu_observed or ctx.host_time is None or not ctx.host_time.helpers:
        return []
    return [
        Finding(
            rule=GPU_NOT_OBSERVED,
            severity=Severity.INFO,
            title="The trace has no GPU activity: GPU-based checks are not observed",
            evidence=[
                Evidence(name=f"{rule}: {needs}", value=NOT_OBSERVED) for rule, needs in NEEDS_GPU
            ],
            recommendation=(
                "Findings above come from the host ranges alone. Profile a GPU run of the same "
                "workload (cptrace run on a GPU host, or nsys with CUPTI tracing) to measure the "
                "kernels, the idle gaps and the savings."
            ),
        )
    ]
