"""How a run is named in a comment and where its comparison page lives.

One function per job, shared by the comparison page's preview, the PR endpoint, the CLI and the
service loop, so the same run is labelled the same way wherever a comment is rendered.
"""

from __future__ import annotations

from urllib.parse import urlencode


def run_label(run_id: int, name: str, commit: str | None = None, window: str | None = None) -> str:
    """``#12 nightly @ 0123456789 [arm:a]``: id, name, the short commit and the window if any."""
    label = f"#{run_id} {name}"
    if commit:
        label += f" @ {commit[:10]}"
    return f"{label} [{window}]" if window else label


def compare_url(
    base_id: int, head_id: int, base_window: str | None = None, head_window: str | None = None
) -> str:
    """Site-relative URL of a comparison page (window names are query-encoded)."""
    params = {k: v for k, v in (("base_window", base_window), ("head_window", head_window)) if v}
    suffix = f"?{urlencode(params)}" if params else ""
    return f"/compare/{base_id}/{head_id}{suffix}"


# Names of the base-vs-head figures, shared by the comment, the comparison page and the CLI so
# a number is called the same everywhere: unit and basis in the name. "launches" are CPU launch
# calls (cudaLaunchKernel and its kin), not GPU activities; "busy" is the GPU timeline clipped
# to each step, mean over ranks.
ITERATION_MEDIAN = "iteration time, median (ms)"
ITERATION_P90 = "iteration time, p90 (ms)"
LAUNCHES_PER_STEP = "launches per step"
LAUNCHES_BASIS = "CPU launch calls, summed over helpers and ranks"
GPU_TIME_PER_STEP = "GPU time ms/step (summed over helpers and ranks)"
SPAN_PER_STEP = "span ms/step (mean over ranks)"
BUSY_PER_STEP = "GPU busy ms/step (mean over ranks, clipped to the step)"
HOST_CALLS_PER_STEP = "calls per step"
HOST_MS_PER_STEP = "self host ms/step"
HOST_BASIS = (
    "host ranges of each helper's outermost calls, less the catalogued helpers nested in them; "
    "per step, summed over ranks"
)
