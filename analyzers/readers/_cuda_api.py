"""Which CUDA API calls count as launches (shared by the nsys and Kineto readers)."""

from __future__ import annotations

import re

LAUNCH_API = re.compile(
    r"^(cudaLaunch(?!HostFunc)\w*|cuLaunch(?!HostFunc)\w*|cudaGraphLaunch\w*|cuGraphLaunch\w*"
    r"|cudaMemcpy\w*|cudaMemset\w*|cuMemcpy\w*|cuMemset\w*)$"
)
"""API calls that put work on a GPU and own the correlation id of that work.

Host functions (``cudaLaunchHostFunc``) run on the CPU and produce no GPU activity.
"""

_VERSION_SUFFIX = re.compile(r"_v\d+$")


def normalize_api(name: str) -> str:
    """Drop the ABI suffix nsys appends (``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``)."""
    return _VERSION_SUFFIX.sub("", name)


def is_launch_api(name: str) -> bool:
    """True for calls whose correlation id links CPU launch to GPU work."""
    return LAUNCH_API.match(normalize_api(name)) is not None
