"""Which Python frame is the user's: one rule for the profiled process and the analysis.

``cptrace profile`` records the line of each blocking CUDA sync at the innermost frame of the
user's code (``runners/profile/synclines.py``), and the analysis points a host sync at the
innermost user frame of the Kineto stack around it (``analyzers/findings/summary.py``). The two
are joined by that frame, so both sides must skip the same frames: torch's, installed
libraries', built-ins and frozen modules; and both leave out the syncs cptrace's own profile
hooks make. Kineto names a frame ``file(line): function``, with
``file`` shortened (``torch/nn/modules/module.py``); a live frame's ``co_filename`` is the full
path; the pattern holds for both.
"""

from __future__ import annotations

import re

LIBRARY_FRAME = re.compile(r"site-packages|dist-packages|/torch/|^<built-in|^torch/|^<frozen")
"""A frame (Kineto name or ``co_filename``) of torch, an installed library or the interpreter."""
PROFILE_HOOK_FRAME = re.compile(r"(?:^|[/\\])runners[/\\]profile[/\\]")
"""A frame of the hooks ``cptrace profile`` runs inside the job (``runners/profile/``: the step
clock, the PyTorch profiler's stepping, the probe): a sync made under one is cptrace's, not the
job's (the profiler synchronizes the device when it stops tracing). Kineto shortens the file
name to ``runners/profile/torchprof.py`` from a checkout and from site-packages alike."""


def is_library_frame(name: str) -> bool:
    """Whether ``name`` (a Kineto frame name or a file name) is not the user's code."""
    return LIBRARY_FRAME.search(name) is not None


def is_profile_hook_frame(name: str) -> bool:
    """Whether ``name`` (a Kineto frame name or a file name) is one of cptrace's profile hooks."""
    return PROFILE_HOOK_FRAME.search(name) is not None


def same_file(short: str, full: str) -> bool:
    """Whether Kineto's shortened file name ``short`` (relative to a ``sys.path`` entry) names
    the file ``full`` (a frame's ``co_filename``): equal, or its tail at a path separator."""
    if short == full:
        return True
    return full.endswith(short) and full[-len(short) - 1] in "/\\"


__all__ = [
    "LIBRARY_FRAME",
    "PROFILE_HOOK_FRAME",
    "is_library_frame",
    "is_profile_hook_frame",
    "same_file",
]
