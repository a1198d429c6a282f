"""Named ranges around every cp_attention phase.

Traces are only useful when each kernel can be attributed to the helper that launched it, so
every phase opens one ``record_function`` (seen by the PyTorch profiler) and one NVTX range
(seen by Nsight Systems) with the same name, ``cp_attention.<phase>``. NVTX is only touched when
CUDA is available, so the CPU tests and CPU-only hosts pay nothing for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

PREFIX = "cp_attention."

#: The phases the analyzers' helper catalog knows about (docs/architecture.md).
PHASES = (
    "metadata",
    "metadata_step",
    "partition",
    "attn_fwd_step",
    "attn_bwd_step",
    "comm_send_recv",
    "comm_all_gather",
    "merge",
    "grad_zero_fill",
    "grad_reduce",
)


_NVTX = torch.cuda.is_available()


@contextmanager
def named_range(name: str) -> Iterator[None]:
    """Open a profiler range and, on CUDA hosts, an NVTX range called ``name`` (verbatim).

    The ``record_function`` is only created while the PyTorch profiler is running: the CP
    step opens ~30 ranges per layer, and their host cost would otherwise delay kernel
    launches. NVTX ranges cost ~1 us and are always emitted, so Nsight Systems sees them.
    """
    profiling = torch.autograd.profiler._is_profiler_enabled
    context = torch.autograd.profiler.record_function(name) if profiling else nullcontext()
    with context:
        if _NVTX:
            torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            if _NVTX:
                torch.cuda.nvtx.range_pop()


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Wrap one cp_attention phase in ``cp_attention.<name>``.

    :raises ValueError: for a phase name the catalog does not know, so a typo cannot silently
        produce unattributed kernels.
    """
    if name not in PHASES:
        raise ValueError(f"unknown cp_attention phase {name!r}; valid phases: {', '.join(PHASES)}")
    with named_range(PREFIX + name):
        yield
