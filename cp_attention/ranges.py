"""Named ranges around every cp_attention phase.

Traces are only useful when each kernel can be attributed to the helper that launched it, so
every phase opens one ``record_function`` (seen by the PyTorch profiler) and one NVTX range
(seen by Nsight Systems) with the same name, ``cp_attention.<phase>``. NVTX is only touched when
CUDA is available, so the CPU tests and CPU-only hosts pay nothing for it.
"""

from __future__ import annotations

from typing import Any

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


class named_range:  # lower case: used like a function, ``with named_range(name):``
    """Open a profiler range and, on CUDA hosts, an NVTX range called ``name`` (verbatim).

    The ``record_function`` is only created while the PyTorch profiler is running: the CP
    step opens ~30 ranges per layer, and their host cost would otherwise delay kernel
    launches. NVTX ranges cost ~1 us and are always emitted, so Nsight Systems sees them.
    A small class rather than a generator context manager: it is entered ~30 times per layer
    in the eager step, and a generator-based one costs several objects per entry.
    """

    __slots__ = ("_name", "_record")

    def __init__(self, name: str) -> None:
        self._name = name
        self._record: Any = None

    def __enter__(self) -> None:
        if torch.autograd.profiler._is_profiler_enabled:
            self._record = torch.autograd.profiler.record_function(self._name)
            self._record.__enter__()
        if _NVTX:
            torch.cuda.nvtx.range_push(self._name)

    def __exit__(self, *exc: object) -> None:
        if _NVTX:
            torch.cuda.nvtx.range_pop()
        if self._record is not None:
            record, self._record = self._record, None
            record.__exit__(*exc)


_FULL_NAMES = {name: PREFIX + name for name in PHASES}


def phase(name: str) -> named_range:
    """Wrap one cp_attention phase in ``cp_attention.<name>``.

    :raises ValueError: for a phase name the catalog does not know, so a typo cannot silently
        produce unattributed kernels.
    """
    full = _FULL_NAMES.get(name)
    if full is None:
        raise ValueError(f"unknown cp_attention phase {name!r}; valid phases: {', '.join(PHASES)}")
    return named_range(full)
