"""CUDA-graph capture of CP attention steps, cached by packed layout.

The metadata of a packed batch is decided from values on the host (:class:`PackedBatch`), so
for one layout every kernel of a CP step has static shapes and reads static metadata buffers:
the step can be captured once into a CUDA graph and replayed, which removes the host cost of
launching it (Python, the cuDNN frontend, the merges), the part that grows with ``cp``.

A :class:`StepGraphs` cache maps a *layout* (what the host plan depends on: offsets, cp size,
strategy, rank, kernel, tuning, tensor shapes) to one :class:`CapturedStep`. Inputs are either

* copied (default): the graph owns static input buffers; each call copies the caller's
  tensors into them (no copy for a tensor that already is the static buffer), so any tensors
  with the layout's shapes replay the same graph; or
* bound (``bind=True``): the graph reads the caller's tensors themselves, and the key is those
  tensor objects (held by the cache); a caller that keeps its buffers (a benchmark loop, a
  model whose inputs live in its own static buffers) replays with no copy at all, and other
  tensors capture anew.

Outputs are the graph's static buffers, overwritten by the next replay of the same graph (as
for ``torch.cuda.graphs``); a caller that needs them longer clones them.

A new layout captures a new graph (counted in :attr:`StepGraphs.stats`, logged at INFO); a
capture that fails (no CUDA device, an operation that cannot be captured) is logged once as a
WARNING and that layout then runs eagerly (counted). Inside a caller's own capture (its
``torch.cuda.graph`` or ``make_graphed_callables``) the step runs eagerly, so it becomes part of
the caller's graph: the eager step does no host sync, so it is capturable there too.

Captured graphs are released at interpreter exit before the cuDNN graphs they launch
(:func:`release_all`; :func:`cp_attention.local_attention.release_cached_kernels` calls it).
"""

from __future__ import annotations

import atexit
import logging
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_LOG = logging.getLogger("cp_attention.graphs")

#: A step as the cache runs it: static inputs in, output tensors out.
StepFn = Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]

#: Eager runs on a side stream before capture: the first builds cuDNN graphs, compiles Triton
#: kernels and settles kernel choices; the second runs with everything cached, as replays do.
WARMUP_RUNS = 2

_CACHES: weakref.WeakSet[StepGraphs] = weakref.WeakSet()
_EXIT_HOOK: list[bool] = []


class GraphCaptureError(RuntimeError):
    """A step could not be captured into a CUDA graph (the caller runs it eagerly)."""


@dataclass(slots=True)
class GraphStats:
    """What a :class:`StepGraphs` cache did so far."""

    #: Graphs captured (the first of a layout, and every re-capture).
    captures: int = 0
    #: Captures for a layout other than the ones cached (the layout changed).
    layout_changes: int = 0
    replays: int = 0
    #: Calls run eagerly because their layout's capture failed.
    fallbacks: int = 0
    #: Calls run eagerly because the caller was capturing (part of the caller's graph).
    nested: int = 0
    #: Graphs dropped to stay within the capacity (least recently used first).
    evictions: int = 0


@dataclass(slots=True)
class CapturedStep:
    """One captured graph with its static inputs and outputs."""

    graph: Any
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    #: The captured function: it holds what the graph reads besides its inputs (the
    #: :class:`PackedBatch` device buffers, cached kernel metadata), so they stay alive.
    keep: object = None
    #: The static inputs are the caller's tensors (replays copy nothing).
    bound: bool = False

    def replay(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Copy ``inputs`` into the static inputs (unless they are them) and replay."""
        if not self.bound:
            for static, given in zip(self.inputs, inputs, strict=True):
                if given.data_ptr() != static.data_ptr():
                    static.copy_(given)
        self.graph.replay()
        return self.outputs


#: ``capture(fn, inputs, bind) -> CapturedStep``; raises :class:`GraphCaptureError`.
Capture = Callable[[StepFn, Sequence[torch.Tensor], bool], CapturedStep]


def capture_cuda(fn: StepFn, inputs: Sequence[torch.Tensor], bind: bool) -> CapturedStep:
    """Warm ``fn`` up on a side stream, then capture it into a ``torch.cuda.CUDAGraph``.

    :raises GraphCaptureError: without CUDA, for inputs on several devices or on the host, or
        when the capture itself fails (the message says why).
    """
    devices = {t.device for t in inputs}
    if not torch.cuda.is_available() or len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise GraphCaptureError(f"CUDA graphs need every input on one CUDA device, got "
                                f"{sorted(map(str, devices))}")
    device = next(iter(devices))
    with torch.no_grad(), torch.cuda.device(device):
        static = list(inputs) if bind else [t.detach().clone() for t in inputs]
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        try:
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    fn(static)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outputs = tuple(fn(static))
        except Exception as exc:
            raise GraphCaptureError(f"{type(exc).__name__}: {exc}") from exc
    return CapturedStep(graph, tuple(static), outputs, keep=fn, bound=bind)


def _signature(inputs: Sequence[torch.Tensor], bind: bool) -> tuple:
    """What a graph bakes in about its inputs.

    Bound: the tensor objects themselves (by id: the cache holds them, so no other object can
    take their ids while the graph is cached; a bound tensor must not be resized or re-pointed
    in place). Copied: dtype, shape, strides and device.
    """
    if bind:
        return (True, *map(id, inputs))
    return tuple((t.dtype, t.shape, t.stride(), t.device) for t in inputs)


class StepGraphs:
    """A small cache of captured CP steps keyed by layout (see the module docstring)."""

    def __init__(self, capacity: int = 16, capture: Capture = capture_cuda) -> None:
        """:param capacity: graphs kept; the least recently used one is dropped beyond it.
        :param capture: how a step is captured (:func:`capture_cuda`).
        """
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._capture = capture
        self._graphs: OrderedDict[tuple, CapturedStep] = OrderedDict()
        #: Keys whose capture failed -> why (those run eagerly, warned once).
        self.failed: dict[tuple, str] = {}
        self.stats = GraphStats()
        _CACHES.add(self)

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, layout: Hashable, fn: StepFn, inputs: Sequence[torch.Tensor], *,
            bind: bool = False) -> tuple[torch.Tensor, ...]:
        """``fn(inputs)``, through the graph captured for ``layout`` (captured on first use).

        ``fn`` must be a pure function of ``inputs`` and ``layout`` (every other tensor it
        reads must stay alive and unchanged, as a :class:`PackedBatch`'s device buffers do).
        """
        if _capturing(inputs):
            self.stats.nested += 1
            return tuple(fn(list(inputs)))
        key = (layout, _signature(inputs, bind))
        hit = self._graphs.get(key)
        if hit is not None:
            self._graphs.move_to_end(key)
            self.stats.replays += 1
            return hit.replay(inputs)
        if key in self.failed:
            self.stats.fallbacks += 1
            return tuple(fn(list(inputs)))
        return self._capture_and_run(key, fn, inputs, bind)

    def _capture_and_run(self, key: tuple, fn: StepFn, inputs: Sequence[torch.Tensor],
                         bind: bool) -> tuple[torch.Tensor, ...]:
        try:
            captured = self._capture(fn, inputs, bind)
        except GraphCaptureError as exc:
            self.failed[key] = str(exc)
            self.stats.fallbacks += 1
            _LOG.warning("cp_attention: CUDA graph capture failed (%s); this layout runs eagerly",
                         exc)
            return tuple(fn(list(inputs)))
        if not _EXIT_HOOK:
            # Registered after the first capture, so after cudnn_graph's hook (the warm-up
            # built the kernels): atexit runs in reverse, so graphs go before the cuDNN plans.
            atexit.register(release_all)
            _EXIT_HOOK.append(True)
        changed = bool(self._graphs) and all(k[0] != key[0] for k in self._graphs)
        self.stats.captures += 1
        self.stats.layout_changes += changed
        _LOG.info("cp_attention: captured CUDA graph %d%s (%d cached)", self.stats.captures,
                  " for a new layout" if changed else "", len(self._graphs) + 1)
        self._graphs[key] = captured
        while len(self._graphs) > self.capacity:
            self._graphs.popitem(last=False)
            self.stats.evictions += 1
        self.stats.replays += 1
        return captured.replay(inputs)

    def clear(self) -> None:
        """Drop every captured graph (and the memory pools they hold)."""
        self._graphs.clear()
        self.failed.clear()


def _capturing(inputs: Sequence[torch.Tensor]) -> bool:
    """Whether the caller is capturing a CUDA graph on the current stream."""
    return (torch.cuda.is_available() and any(t.is_cuda for t in inputs)
            and torch.cuda.is_current_stream_capturing())


def release_all() -> None:
    """Drop the graphs of every cache (run at exit, before the cuDNN graphs are released)."""
    for cache in list(_CACHES):
        cache.clear()
