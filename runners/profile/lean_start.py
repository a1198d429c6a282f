"""Starting and stepping ``torch.profiler.profile`` without importing the compiler stack.

Each time a profiling cycle begins, ``torch.profiler.profile.prepare_trace`` asks
``hasattr(torch, "_inductor")`` to read inductor's CUDA-graph flag. ``torch`` answers a lazy
module's name through its module ``__getattr__``, which imports ``torch._inductor`` and with it
``torch._dynamo``: about 1.6 s of CPU in every profiled rank (measured on CPU torch 2.13), in a
process that compiled nothing. Without ``torch._inductor`` imported no inductor CUDA graph can
exist, so the flag the profiler wants is False, which is what the lookup answers while
``_inductor`` is left out of torch's lazy names.

Where torch has no such set (another version), nothing is changed: the profiler then pays the
import, as before. The window is only the profiler's own start/step call; a thread of the
profiled program that reads ``torch._inductor`` as an attribute inside that window without
having imported it would see an ``AttributeError`` (``import torch._inductor`` is unaffected).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def without_inductor_import() -> Iterator[None]:
    """Run a profiler start or step with ``hasattr(torch, "_inductor")`` not importing it."""
    import torch

    lazy = getattr(torch, "_lazy_modules", None)
    if "torch._inductor" in sys.modules or not isinstance(lazy, set) or "_inductor" not in lazy:
        yield
        return
    lazy.discard("_inductor")
    try:
        yield
    finally:
        lazy.add("_inductor")
