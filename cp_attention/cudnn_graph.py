"""cuDNN fused attention (SDPA) graphs for ragged THD, driven directly from CP metadata.

``nvidia-cudnn-frontend`` also ships ``torch.ops.cudnn.sdpa_fwd/bwd``, but those rebuild the
ragged offsets and sequence lengths from ``cu_seqlens`` with small device kernels on every call
and cost ~0.5-0.9 ms of host time per call, which the 4-calls-per-layer CP ring cannot afford.
This backend builds each graph once per shape (cached), derives the ragged offsets once per
planned call (cached on the :class:`~cp_attention.plan.AttnCall`, i.e. once per batch), and then
only executes the graph.

Layout: packed ``[T, H, D]`` tensors are described as ``[B, H, S_max, D]`` with the token
stride and a per-sequence ragged offset (element offset of each sequence's first token). The
softmax stats (log-sum-exp, natural log) come back ragged ``[T, H]``; the backward graph takes
them ragged where the GPU accepts it (Hopper/Blackwell) and padded otherwise.

In place (``fwd_in_place``/``bwd_in_place``): when every segment of a planned call is contiguous
in its buffer (``AttnCall.q_starts``/``k_starts``), the ragged offsets point at the segments
inside the whole local buffers (gaps between segments allowed, as in TE's padded THD), so the
CP step gathers no rows into packed copies; outputs come back in buffers shaped like the inputs,
valid at the call's rows (gradient buffers zero elsewhere). This relies on the lowering reading
the bound offsets: the cuDNN library does; cudnn-frontend's own Python (FROST) THD lowerings did
not in the versions of its issue #737, so a graph served by a Python engine is not used in place
(:meth:`CudnnGraphAttention.serves_in_place`).

dQ in float32 (``dq_dtype=torch.float32`` on ``bwd``/``bwd_in_place``): the backward graph's dQ
output is declared FLOAT. cuDNN accumulates dQ in a float32 buffer either way; with a 16-bit dQ
it runs one more kernel per call (``convert_dq_to_16bits``) that reads that buffer and writes the
16-bit copy, which a caller summing several calls' dQ (a CP rank's ring steps) would read again.
cuDNN 9.19 accepts such a graph but still runs its 16-bit conversion into the float32 buffer
(wrong values, no error), so a float32 dQ is used only after a one-time check on the device
shows the library honours it (:meth:`CudnnGraphAttention.float_dq_honoured`); otherwise, and
for shapes the library declines, the 16-bit graph serves the call (logged).

Autotune (``cudnn_autotune``): besides the heuristics' plans (modes A, B, FALLBACK), every knob
value of the engine that serves the top plan is tried one knob at a time
(``get_knobs_for_engine`` / ``create_execution_plan``), at most :data:`KNOB_CANDIDATES` per
graph; all plans that build are timed on the first call's buffers and the fastest is kept.

Graphs, handles and cached plans are released at interpreter exit (:func:`release_all`), before
the frontend's own exit hooks run, so nanobind reports no leaked instances.
"""

from __future__ import annotations

import atexit
import gc
import logging
import threading
import time
import weakref
from typing import Any

import torch

_LOG = logging.getLogger("cp_attention.cudnn")
_INSTANCES: weakref.WeakSet = weakref.WeakSet()

_FWD, _BWD = "fwd", "bwd"
# Graph tensor ids.
Q, K, V, OUT, STATS, DO, DQ, DK, DV = 1, 2, 3, 4, 5, 6, 7, 8, 9
LEN_Q, LEN_K, R_Q, R_K, R_V, R_O, R_STATS, R_DQ, R_DK, R_DV = range(20, 30)


class GraphUnsupported(RuntimeError):
    """cuDNN declined to build a graph for this shape (the caller may fall back)."""


#: Knob variants tried per graph by the autotuner (one knob changed at a time), and the
#: seconds spent building plans, per graph and per backend object.
KNOB_CANDIDATES = 48
KNOB_BUILD_SECONDS = 12.0
KNOB_BUILD_SECONDS_TOTAL = 240.0


def _round64(n: int) -> int:
    return (n + 63) // 64 * 64


def _desc_stride(t: torch.Tensor, s_max: int) -> list[int]:
    """``[B, H, S, D]`` descriptor strides of a packed ``[T, H, D]`` tensor (batch via ragged)."""
    s_t, s_h, s_d = t.stride()
    return [s_max * s_t, s_h, s_t, s_d]


class CudnnGraphAttention:
    """The ``cudnn`` local-attention backend (see module docstring)."""

    name = "cudnn"
    #: ``bwd``/``bwd_in_place`` take ``dq_dtype`` (float32: no dQ conversion kernel).
    accepts_dq_dtype = True

    def __init__(self, autotune: bool = False, fwd_implementation: str | None = None) -> None:
        """:param autotune: build every plan the heuristics offer for a shape (and the knob
            variants of the top plan's engine) and keep the fastest one, timed on the first
            call's real buffers (backend ``cudnn_autotune``).
        :param fwd_implementation: the frontend's SDPA forward implementation, ``"UNIFIED"``
            or ``"COMPOSITE"`` (default: the frontend's AUTO choice); for measurements.
        """
        import cudnn

        self.autotune = autotune
        self.fwd_implementation = fwd_implementation
        if autotune:
            self.name = "cudnn_autotune"
        #: Autotuned graph key -> (plans offered, plan kept, median ms of each plan).
        self.tuned: dict[tuple, tuple[int, int, list[float]]] = {}
        #: Autotuned graph key -> plan names (index order) and the knob space swept.
        self.plan_names: dict[tuple, list[str]] = {}
        #: (The last entry: ``("built", plans built, plans listed, seconds spent)``.)
        self.knob_space: dict[tuple, list[tuple[str, int, int, float]]] = {}
        #: Backward graph shapes whose float32-dQ graph the library declined.
        self.dq_float_declined: set[tuple] = set()
        self._pending_space: list[tuple[str, int, int, float]] | None = None
        self._sweep_left = KNOB_BUILD_SECONDS_TOTAL
        #: Device index -> whether a float32 dQ output comes back right (probed once).
        self._float_dq_ok: dict[int, bool] = {}
        self._pending_built: list[int] = []
        #: Autotuned graph key -> indices of the plans that built (the ones timed).
        self.built_plans: dict[tuple, list[int]] = {}

        self._cudnn = cudnn
        self._graphs: dict[tuple, tuple[Any, int, list[int]]] = {}
        self._lock = threading.Lock()
        self._handles: dict[int, Any] = {}
        #: Device index -> the stream its handle was last bound to.
        self._streams: dict[int, int] = {}
        self._ragged_stats_bwd: bool | None = None
        #: Graph key -> the engine that serves it ("cudnn backend" or a frontend engine name).
        self.engines: dict[tuple, str] = {}
        if not _INSTANCES:
            # Registered after ``import cudnn`` registered its own hooks: atexit runs in reverse,
            # so the graphs are gone before the frontend destroys its default handles.
            atexit.register(release_all)
        _INSTANCES.add(self)

    def release(self) -> None:
        """Drop every cached graph and destroy the handles (the object stays usable)."""
        with self._lock:
            self._graphs.clear()
            self.engines.clear()
            handles, self._handles = list(self._handles.values()), {}
            self._streams.clear()
        gc.collect()
        for handle in handles:
            try:
                self._cudnn.destroy_handle(handle)
            except Exception as exc:  # CUDA may already be torn down at exit
                _LOG.debug("destroy_handle failed at release: %s", exc)

    @staticmethod
    def engine_name(graph: Any) -> str:
        """Which engine serves a built graph: the cuDNN library, or a frontend Python engine."""
        engine = getattr(graph, "selected_engine", None)
        return "cudnn backend" if engine is None else f"frontend:{engine.name}"

    def serves_in_place(self, key: tuple) -> bool:
        """Whether the graph of ``key`` reads bound ragged offsets (the cuDNN library does)."""
        return self.engines.get(key, "cudnn backend") == "cudnn backend"

    # -- host-side plumbing -------------------------------------------------------------
    def _handle(self, device: torch.device) -> Any:
        """The device's handle, bound to the current stream (one frontend call per execute
        instead of two: ``set_stream`` only when the stream changed since the last call)."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._handles:
            with torch.cuda.device(index):
                self._handles[index] = self._cudnn.create_handle()
            self._streams.pop(index, None)
        handle = self._handles[index]
        stream = torch.cuda.current_stream(device).cuda_stream
        if self._streams.get(index) != stream:
            self._cudnn.set_stream(handle=handle, stream=stream)
            self._streams[index] = stream
        return handle

    def _graph(self, key: tuple, build) -> tuple[Any, int, list[int]]:
        """The cached graph of ``key``, built on first use.

        :raises GraphUnsupported: when cuDNN declines to build it (validation, no plan).
        """
        hit = self._graphs.get(key)
        if hit is None:
            with self._lock:
                hit = self._graphs.get(key)
                if hit is None:
                    try:
                        hit = build()
                    except Exception as exc:
                        self._pending_space = None
                        raise GraphUnsupported(f"{type(exc).__name__}: {exc}") from exc
                    self._graphs[key] = hit
                    self.engines[key] = self.engine_name(hit[0])
                    if self._pending_space:
                        self.knob_space[key] = self._pending_space
                        self.built_plans[key] = self._pending_built
                    self._pending_space = None
        return hit

    @staticmethod
    def _ragged(cache: dict | None, cu_q: torch.Tensor, cu_k: torch.Tensor,
                strides: tuple[int, ...]) -> dict[str, torch.Tensor]:
        """Sequence lengths and element offsets, computed once per planned call and strides."""
        key = ("cudnn_ragged", strides)
        if cache is not None and key in cache:
            return cache[key]
        q64, k64 = cu_q.to(torch.int64), cu_k.to(torch.int64)
        sq, so, sst, sdq, sk, sv, sdk, sdv = strides
        out = {
            "len_q": (cu_q[1:] - cu_q[:-1]).to(torch.int32).view(-1, 1, 1, 1),
            "len_k": (cu_k[1:] - cu_k[:-1]).to(torch.int32).view(-1, 1, 1, 1),
            "q": (q64 * sq).view(-1, 1, 1, 1), "o": (q64 * so).view(-1, 1, 1, 1),
            "stats": (q64 * sst).view(-1, 1, 1, 1), "dq": (q64 * sdq).view(-1, 1, 1, 1),
            "k": (k64 * sk).view(-1, 1, 1, 1), "v": (k64 * sv).view(-1, 1, 1, 1),
            "dk": (k64 * sdk).view(-1, 1, 1, 1), "dv": (k64 * sdv).view(-1, 1, 1, 1),
        }
        if cache is not None:
            cache[key] = out
        return out

    @staticmethod
    def _ragged_in_place(cache: dict, call: Any,
                         strides: tuple[int, ...]) -> dict[str, torch.Tensor]:
        """Like :meth:`_ragged`, with each segment starting at its row in the whole buffer."""
        key = ("cudnn_ragged_in_place", strides)
        if key in cache:
            return cache[key]
        len_q = call.cu_q[1:] - call.cu_q[:-1]
        len_k = call.cu_k[1:] - call.cu_k[:-1]
        # b+1 entries: each segment's first row, then the end of the last segment.
        rq = torch.cat([call.q_starts, call.q_starts[-1:] + len_q[-1:].to(torch.int64)])
        rk = torch.cat([call.k_starts, call.k_starts[-1:] + len_k[-1:].to(torch.int64)])
        sq, so, sst, sdq, sk, sv, sdk, sdv = strides
        out = {
            "len_q": len_q.to(torch.int32).view(-1, 1, 1, 1),
            "len_k": len_k.to(torch.int32).view(-1, 1, 1, 1),
            "q": (rq * sq).view(-1, 1, 1, 1), "o": (rq * so).view(-1, 1, 1, 1),
            "stats": (rq * sst).view(-1, 1, 1, 1), "dq": (rq * sdq).view(-1, 1, 1, 1),
            "k": (rk * sk).view(-1, 1, 1, 1), "v": (rk * sv).view(-1, 1, 1, 1),
            "dk": (rk * sdk).view(-1, 1, 1, 1), "dv": (rk * sdv).view(-1, 1, 1, 1),
        }
        cache[key] = out
        return out

    def _strides(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, ...]:
        hq, d = q.shape[1], q.shape[2]
        return (q.stride(0), hq * d, hq, hq * d, k.stride(0), v.stride(0), k.shape[1] * d,
                v.shape[1] * v.shape[2])

    # -- graphs -------------------------------------------------------------------------
    def _new_graph(self, dtype: torch.dtype, handle: Any) -> Any:
        c = self._cudnn
        io = {torch.bfloat16: c.data_type.BFLOAT16, torch.float16: c.data_type.HALF}[dtype]
        graph = c.pygraph(handle=handle, io_data_type=io, intermediate_data_type=c.data_type.FLOAT,
                          compute_data_type=c.data_type.FLOAT)
        return graph, io

    def _offset(self, g: Any, name: str, b: int, uid: int) -> Any:
        return g.tensor(name=name, dim=[b + 1, 1, 1, 1], stride=[1, 1, 1, 1],
                        data_type=self._cudnn.data_type.INT64, uid=uid)

    def _lengths(self, g: Any, b: int) -> tuple[Any, Any]:
        i32 = self._cudnn.data_type.INT32
        return (g.tensor(name="len_q", dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i32,
                         uid=LEN_Q),
                g.tensor(name="len_k", dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i32,
                         uid=LEN_K))

    def _mask(self, causal: bool, square: bool) -> dict[str, Any]:
        c = self._cudnn
        align = c.diagonal_alignment.TOP_LEFT if square else c.diagonal_alignment.BOTTOM_RIGHT
        return {"diagonal_alignment": align,
                "diagonal_band_right_bound": 0 if causal else None}

    def _finish(self, g: Any, uids: list[int]) -> tuple[Any, int, list[int]]:
        g.validate()
        g.build_operation_graph()
        import cudnn

        if self.autotune:
            # Heuristics mode B too: it may rank other engine configs (knobs) than mode A.
            try:
                g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B,
                                          cudnn.heur_mode.FALLBACK])
            except Exception as exc:
                _LOG.info("heuristics mode B declined (%s); modes A and FALLBACK only", exc)
                g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        else:
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        if not self.autotune:
            g.build_plans()
            return g, g.get_workspace_size(), uids
        start = time.perf_counter()
        space = self._add_knob_plans(g)
        built: list[int] = []
        for i in range(g.get_execution_plan_count()):
            # Knob variants may each compile a kernel: bounded per graph and per process.
            spent = time.perf_counter() - start
            if built and (spent > KNOB_BUILD_SECONDS or self._sweep_left - spent <= 0):
                break
            try:
                g.build_plan_at_index(i)
                built.append(i)
            except Exception as exc:  # a declined or failing variant is not timed
                _LOG.debug("plan %d not built: %s", i, exc)
        if not built:
            raise GraphUnsupported("no plan of the graph could be built")
        g.build_plan_at_index(built[0])  # the heuristics' choice until the first call tunes
        spent = time.perf_counter() - start
        self._sweep_left -= spent
        space = [*space, ("built", len(built), g.get_execution_plan_count(), round(spent, 1))]
        self._pending_space = space
        self._pending_built = built
        sizes = []
        for i in range(g.get_execution_plan_count()):
            try:
                sizes.append(g.get_workspace_size_plan_at_index(i))
            except Exception:
                sizes.append(-1)  # not built: never selected
        # Workspace for any plan, so the choice made at the first call fits.
        return g, max(max(sizes), g.get_workspace_size(), 0), uids

    def _add_knob_plans(self, g: Any) -> list[tuple[str, int, int, float]]:
        """Append plans for the top plan's engine with one knob changed at a time.

        :returns: the knob space of that engine (type, min, max, stride), for the record.
        """
        try:
            engine, base = g.get_engine_and_knobs_at_index(0)
            knobs = list(g.get_knobs_for_engine(engine))
        except Exception as exc:  # older frontends, or a plan without an explicit engine
            _LOG.info("knob sweep skipped: %s", exc)
            return []
        space: list[tuple[str, int, int, float]] = [
            (str(k.type), int(k.min_value), int(k.max_value), int(k.stride)) for k in knobs
        ]
        base = dict(base)
        seen = {_knob_signature(base)}
        added = 0
        for knob in knobs:
            step = max(int(knob.stride), 1)
            for value in range(int(knob.min_value), int(knob.max_value) + 1, step):
                choice = {**base, knob.type: value}
                sig = _knob_signature(choice)
                if sig in seen or added >= KNOB_CANDIDATES:
                    continue
                seen.add(sig)
                try:
                    g.create_execution_plan(engine, choice)
                    added += 1
                except Exception as exc:
                    _LOG.debug("knob plan %s declined: %s", choice, exc)
        return space

    def _tune(self, key: tuple, g: Any, pack: list, workspace: torch.Tensor, handle: Any,
              uids: list[int], device: torch.device) -> None:
        """Time every built plan on this call's buffers and select the fastest (once per key)."""
        if not self.autotune or key in self.tuned:
            return
        count = g.get_execution_plan_count()
        built = set(self.built_plans.get(key, range(count)))
        times: list[float] = []
        for i in range(count):
            if i not in built:
                times.append(float("inf"))
                continue
            try:
                for _ in range(2):
                    g.execute_plan_at_index(pack, workspace, i, handle, tensor_uids=tuple(uids))
                xs = []
                for _ in range(5):
                    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                    start.record()
                    g.execute_plan_at_index(pack, workspace, i, handle, tensor_uids=tuple(uids))
                    end.record()
                    end.synchronize()
                    xs.append(start.elapsed_time(end))
                times.append(sorted(xs)[len(xs) // 2])
            except Exception as exc:  # a plan that did not build or does not run
                _LOG.debug("plan %d of %s not timed: %s", i, key[0], exc)
                times.append(float("inf"))
        best = min(range(count), key=lambda i: times[i])
        names = []
        for i in range(count):
            try:
                names.append(str(g.get_plan_name_at_index(i)))
            except Exception:
                names.append("?")
        g.build_plan_at_index(best)  # builds (already built) and selects it
        self.tuned[key] = (count, best, times)
        self.plan_names[key] = names

    def _build_fwd(self, q, k, v, b, s_q, s_k, causal, square, scale, handle):
        g, io = self._new_graph(q.dtype, handle)
        hq, d = q.shape[1], q.shape[2]
        qt = g.tensor(name="q", dim=[b, hq, s_q, d], stride=_desc_stride(q, s_q), data_type=io,
                      uid=Q)
        kt = g.tensor(name="k", dim=[b, k.shape[1], s_k, d], stride=_desc_stride(k, s_k),
                      data_type=io, uid=K)
        vt = g.tensor(name="v", dim=[b, v.shape[1], s_k, v.shape[2]], stride=_desc_stride(v, s_k),
                      data_type=io, uid=V)
        qt.set_ragged_offset(self._offset(g, "rq", b, R_Q))
        kt.set_ragged_offset(self._offset(g, "rk", b, R_K))
        vt.set_ragged_offset(self._offset(g, "rv", b, R_V))
        len_q, len_k = self._lengths(g, b)
        impl = ({"implementation": getattr(self._cudnn.attention_implementation,
                                           self.fwd_implementation)}
                if self.fwd_implementation else {})
        ot, st = g.sdpa(name="sdpa", q=qt, k=kt, v=vt, generate_stats=True, attn_scale=scale,
                        use_padding_mask=True, seq_len_q=len_q, seq_len_kv=len_k,
                        **self._mask(causal, square), **impl)
        ot.set_uid(OUT).set_output(True).set_dim([b, hq, s_q, v.shape[2]]).set_stride(
            [s_q * hq * d, d, hq * d, 1]).set_data_type(io)
        ot.set_ragged_offset(self._offset(g, "ro", b, R_O))
        st.set_uid(STATS).set_output(True).set_dim([b, hq, s_q, 1]).set_stride(
            [s_q * hq, 1, hq, 1]).set_data_type(self._cudnn.data_type.FLOAT)
        st.set_ragged_offset(self._offset(g, "rs", b, R_STATS))
        return self._finish(g, [Q, K, V, OUT, STATS, LEN_Q, LEN_K, R_Q, R_K, R_V, R_O, R_STATS])

    def _build_bwd(self, q, k, v, b, s_q, s_k, causal, square, scale, handle, ragged_stats,
                   dq_float=False):
        g, io = self._new_graph(q.dtype, handle)
        hq, hk, hv, d, dv = q.shape[1], k.shape[1], v.shape[1], q.shape[2], v.shape[2]
        qt = g.tensor(name="q", dim=[b, hq, s_q, d], stride=_desc_stride(q, s_q), data_type=io,
                      uid=Q)
        kt = g.tensor(name="k", dim=[b, hk, s_k, d], stride=_desc_stride(k, s_k), data_type=io,
                      uid=K)
        vt = g.tensor(name="v", dim=[b, hv, s_k, dv], stride=_desc_stride(v, s_k), data_type=io,
                      uid=V)
        packed = [s_q * hq * dv, dv, hq * dv, 1]
        ot = g.tensor(name="o", dim=[b, hq, s_q, dv], stride=packed, data_type=io, uid=OUT)
        dot = g.tensor(name="do", dim=[b, hq, s_q, dv], stride=packed, data_type=io, uid=DO)
        stats_stride = [s_q * hq, 1, hq, 1] if ragged_stats else [hq * s_q, s_q, 1, 1]
        st = g.tensor(name="stats", dim=[b, hq, s_q, 1], stride=stats_stride,
                      data_type=self._cudnn.data_type.FLOAT, uid=STATS)
        qt.set_ragged_offset(self._offset(g, "rq", b, R_Q))
        kt.set_ragged_offset(self._offset(g, "rk", b, R_K))
        vt.set_ragged_offset(self._offset(g, "rv", b, R_V))
        r_o = self._offset(g, "ro", b, R_O)
        ot.set_ragged_offset(r_o)
        dot.set_ragged_offset(r_o)  # dO is laid out like O
        len_q, len_k = self._lengths(g, b)
        if ragged_stats:
            st.set_ragged_offset(self._offset(g, "rs", b, R_STATS))
        dqt, dkt, dvt = g.sdpa_backward(
            name="sdpa_bwd", q=qt, k=kt, v=vt, o=ot, dO=dot, stats=st, attn_scale=scale,
            use_padding_mask=True, seq_len_q=len_q, seq_len_kv=len_k,
            max_total_seq_len_q=_round64(q.shape[0]), max_total_seq_len_kv=_round64(k.shape[0]),
            **self._mask(causal, square))
        for t, uid, dims, r_name, r_uid in (
            (dqt, DQ, [b, hq, s_q, d], "rdq", R_DQ), (dkt, DK, [b, hk, s_k, d], "rdk", R_DK),
            (dvt, DV, [b, hv, s_k, dv], "rdv", R_DV),
        ):
            dtype = self._cudnn.data_type.FLOAT if dq_float and uid == DQ else io
            t.set_uid(uid).set_output(True).set_dim(dims).set_stride(
                [dims[2] * dims[1] * dims[3], dims[3], dims[1] * dims[3], 1]).set_data_type(dtype)
            t.set_ragged_offset(self._offset(g, r_name, b, r_uid))
        uids = [Q, K, V, OUT, DO, STATS, DQ, DK, DV, LEN_Q, LEN_K, R_Q, R_K, R_V, R_O, R_DQ, R_DK,
                R_DV] + ([R_STATS] if ragged_stats else [])
        return self._finish(g, uids)

    # -- interface ----------------------------------------------------------------------
    def fwd_key(self, q, k, v, b, max_q, max_k, causal, square, scale) -> tuple:
        """The cache key of a forward graph (everything the graph bakes in)."""
        return (_FWD, q.dtype, b, q.shape[1:], k.shape[1:], v.shape[1:], q.stride(), k.stride(),
                v.stride(), max_q, max_k, causal, square, scale, q.device)

    def bwd_key(self, q, k, v, b, max_q, max_k, causal, square, scale,
                dq_dtype: torch.dtype | None = None) -> tuple:
        """The cache key of a backward graph (token counts size its workspace)."""
        return (_BWD, q.dtype, b, q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(),
                max_q, max_k, causal, square, scale, q.device, dq_dtype or q.dtype)

    def _fwd_graph(self, q, k, v, b, max_q, max_k, causal, square, scale, handle):
        key = self.fwd_key(q, k, v, b, max_q, max_k, causal, square, scale)
        return key, self._graph(key, lambda: self._build_fwd(q, k, v, b, max_q, max_k, causal,
                                                            square, scale, handle))

    def _dq_dtype(self, q, k, v, b, max_q, max_k, causal, square, scale,
                  dq_dtype: torch.dtype | None) -> torch.dtype:
        """``dq_dtype`` if the library serves it for this shape, else ``q``'s dtype."""
        if dq_dtype is None or dq_dtype == q.dtype:
            return q.dtype
        if dq_dtype != torch.float32:
            raise ValueError(f"dq_dtype must be float32 or the input dtype, got {dq_dtype}")
        shape = self.bwd_key(q, k, v, b, max_q, max_k, causal, square, scale)
        if shape in self.dq_float_declined or not self.float_dq_honoured(q.device):
            return q.dtype
        return dq_dtype

    def float_dq_honoured(self, device: torch.device) -> bool:
        """Whether the library writes a correct float32 dQ (checked once per device).

        cuDNN 9.19 accepts a FLOAT dQ output but still runs its 16-bit conversion kernel
        (``convert_dq_to_16bits_ragged``) into that buffer, so every value comes back wrong
        with no error (measured: ``benchmarks/RESULTS.md``, run 8). The check runs one small
        backward both ways and compares; it reads the result back (one sync, on the first
        float32-dQ request only). When it fails, every backward gets a 16-bit dQ.
        """
        index = device.index if device.index is not None else torch.cuda.current_device()
        ok = self._float_dq_ok.get(index)
        if ok is None:
            ok = self._float_dq_ok[index] = self._probe_float_dq(torch.device("cuda", index))
            if not ok:
                _LOG.warning("cp_attention: cuDNN %s returns a wrong float32 dQ (its 16-bit "
                             "dQ conversion still runs); float32 dQ is off, every backward "
                             "returns a 16-bit dQ", self._cudnn.backend_version_string())
        return ok

    def _probe_float_dq(self, device: torch.device) -> bool:
        gen = torch.Generator(device=device).manual_seed(0)
        t, h, d = 192, 2, 128
        q, k, v, dout = (torch.randn(t, h, d, device=device, generator=gen).bfloat16()
                         for _ in range(4))
        cu = torch.tensor([0, 100, t], dtype=torch.int32, device=device)
        args = (cu, cu, 100, 100, True, d ** -0.5, True)
        try:
            out, lse = self.fwd(q, k, v, *args)
            ref = self._bwd(dout, q, k, v, out, lse, *args, None, q.dtype)[0]
            got = self._bwd(dout, q, k, v, out, lse, *args, None, torch.float32)[0]
        except GraphUnsupported as exc:
            _LOG.info("float32 dQ check declined: %s", exc)
            return False
        if got.dtype != torch.float32:
            return False
        err = (got - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)
        return bool(err < 2e-2)

    def _bwd_graph(self, q, k, v, b, max_q, max_k, causal, square, scale, handle,
                   dq_dtype: torch.dtype | None = None):
        """``(key, graph, ragged stats, dq dtype)``; a declined float32 dQ falls back to 16 bits.
        ``dq_dtype`` is already resolved (:meth:`_dq_dtype`)."""
        dq_dtype = dq_dtype or q.dtype
        if dq_dtype != q.dtype:
            try:
                return (*self._bwd_graph_of(q, k, v, b, max_q, max_k, causal, square, scale,
                                            handle, dq_dtype), dq_dtype)
            except GraphUnsupported as exc:
                shape = self.bwd_key(q, k, v, b, max_q, max_k, causal, square, scale)
                self.dq_float_declined.add(shape)
                _LOG.info("float32 dQ declined (%s); 16-bit dQ for this shape", exc)
                dq_dtype = q.dtype
        return (*self._bwd_graph_of(q, k, v, b, max_q, max_k, causal, square, scale, handle,
                                    dq_dtype), dq_dtype)

    def _bwd_graph_of(self, q, k, v, b, max_q, max_k, causal, square, scale, handle,
                      dq_dtype: torch.dtype):
        key = self.bwd_key(q, k, v, b, max_q, max_k, causal, square, scale, dq_dtype)
        dq_float = dq_dtype == torch.float32 and q.dtype != torch.float32
        if self._ragged_stats_bwd is None:
            major = torch.cuda.get_device_capability(q.device)[0]
            self._ragged_stats_bwd = major in (9, 10)
        if self._ragged_stats_bwd:
            try:
                hit = self._graph((*key, True), lambda: self._build_bwd(
                    q, k, v, b, max_q, max_k, causal, square, scale, handle, True, dq_float))
                return (*key, True), hit, True
            except GraphUnsupported as exc:
                _LOG.info("ragged-stats backward declined (%s); padded stats for this shape", exc)
        ragged = False
        hit = self._graph((*key, ragged), lambda: self._build_bwd(
            q, k, v, b, max_q, max_k, causal, square, scale, handle, ragged, dq_float))
        return (*key, ragged), hit, ragged

    def _execute(self, key, g, ws, uids, handle, pack: dict, device) -> None:
        workspace = torch.empty(max(ws, 1), dtype=torch.uint8, device=device)
        ordered = [pack[u] for u in uids]
        self._tune(key, g, ordered, workspace, handle, uids, device)
        g.execute(ordered, workspace, handle=handle, tensor_uids=tuple(uids))

    def _execute_fwd(self, key, g, ws, uids, handle, q, k, v, out, stats, r) -> None:
        pack = {Q: q, K: k, V: v, OUT: out, STATS: stats, LEN_Q: r["len_q"], LEN_K: r["len_k"],
                R_Q: r["q"], R_K: r["k"], R_V: r["v"], R_O: r["o"], R_STATS: r["stats"]}
        self._execute(key, g, ws, uids, handle, pack, q.device)

    def _execute_bwd(self, key, g, ws, uids, handle, dout, q, k, v, out, stats, grads,
                     r) -> None:
        dq, dk, dv = grads
        pack = {Q: q, K: k, V: v, OUT: out, DO: dout, STATS: stats, DQ: dq, DK: dk, DV: dv,
                LEN_Q: r["len_q"], LEN_K: r["len_k"], R_Q: r["q"], R_K: r["k"], R_V: r["v"],
                R_O: r["o"], R_DQ: r["dq"], R_DK: r["dk"], R_DV: r["dv"], R_STATS: r["stats"]}
        self._execute(key, g, ws, uids, handle, pack, q.device)

    def fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, square, cache=None):
        b = cu_q.numel() - 1
        handle = self._handle(q.device)
        key, (g, ws, uids) = self._fwd_graph(q, k, v, b, max_q, max_k, causal, square, scale,
                                             handle)
        r = self._ragged(cache, cu_q, cu_k, self._strides(q, k, v))
        out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
        stats = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
        self._execute_fwd(key, g, ws, uids, handle, q, k, v, out, stats, r)
        return out, stats

    def bwd(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, square,
            cache=None, dq_dtype: torch.dtype | None = None):
        """Gradients; dQ in ``dq_dtype`` (float32 or ``q``'s dtype) when the library serves it
        correctly (:meth:`float_dq_honoured`), else in ``q``'s dtype."""
        b = cu_q.numel() - 1
        dq_dtype = self._dq_dtype(q, k, v, b, max_q, max_k, causal, square, scale, dq_dtype)
        return self._bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale,
                         square, cache, dq_dtype)

    def _bwd(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, square,
             cache, dq_dtype: torch.dtype):
        b = cu_q.numel() - 1
        handle = self._handle(q.device)
        key, (g, ws, uids), ragged, dq_dtype = self._bwd_graph(
            q, k, v, b, max_q, max_k, causal, square, scale, handle, dq_dtype)
        r = self._ragged(cache, cu_q, cu_k, self._strides(q, k, v))
        dout, out = dout.contiguous(), out.contiguous()
        stats = lse.contiguous() if ragged else _padded_stats(lse, cu_q, max_q, cache)
        grads = (torch.empty(q.shape, dtype=dq_dtype, device=q.device),
                 torch.empty(k.shape, dtype=k.dtype, device=k.device),
                 torch.empty(v.shape, dtype=v.dtype, device=v.device))
        self._execute_bwd(key, g, ws, uids, handle, dout, q, k, v, out, stats, grads, r)
        return grads

    # -- in place: whole buffers, segments addressed by their start rows ------------------
    def fwd_in_place(self, q, k, v, call, scale) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Forward of ``call`` on whole buffers; ``(out, lse)`` shaped like ``q``'s rows and
        valid at ``call.q_rows``. None when the graph's engine would ignore the offsets."""
        b = call.cu_q.numel() - 1
        handle = self._handle(q.device)
        key, (g, ws, uids) = self._fwd_graph(q, k, v, b, call.max_q, call.max_k, call.causal,
                                             call.square, scale, handle)
        if not self.serves_in_place(key):
            return None
        r = self._ragged_in_place(call.cache, call, self._strides(q, k, v))
        out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
        stats = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
        self._execute_fwd(key, g, ws, uids, handle, q, k, v, out, stats, r)
        return out, stats

    def bwd_in_place(self, dout, q, k, v, out, lse, call, scale, zero_k_outside=True,
                     zero_q_outside=True, dq_dtype: torch.dtype | None = None):
        """Backward of ``call`` on whole buffers: ``(dq, dk, dv)`` shaped like ``q``/``k``/``v``,
        the call's rows written, every other row zero (dK/dV rows outside left unwritten when
        ``zero_k_outside`` is False, dQ rows when ``zero_q_outside`` is False). None as for
        :meth:`fwd_in_place`."""
        b = call.cu_q.numel() - 1
        handle = self._handle(q.device)
        dq_dtype = self._dq_dtype(q, k, v, b, call.max_q, call.max_k, call.causal, call.square,
                                  scale, dq_dtype)
        key, (g, ws, uids), ragged, dq_dtype = self._bwd_graph(
            q, k, v, b, call.max_q, call.max_k, call.causal, call.square, scale, handle, dq_dtype)
        if not ragged or not self.serves_in_place(key):
            return None
        r = self._ragged_in_place(call.cache, call, self._strides(q, k, v))
        # Rows outside the call must read as zero gradient (a memset, no kernel of ours).
        q_all, k_all = call.q_rows.covers(q.shape[0]), call.k_rows.covers(k.shape[0])
        alloc_q = torch.empty if q_all or not zero_q_outside else torch.zeros
        dq = alloc_q(q.shape, dtype=dq_dtype, device=q.device)
        alloc_k = torch.empty if k_all or not zero_k_outside else torch.zeros
        dk = alloc_k(k.shape, dtype=k.dtype, device=k.device)
        dv = alloc_k(v.shape, dtype=v.dtype, device=v.device)
        self._execute_bwd(key, g, ws, uids, handle, dout.contiguous(), q, k, v, out.contiguous(),
                          lse.contiguous(), (dq, dk, dv), r)
        return dq, dk, dv


def _knob_signature(knobs: dict) -> tuple:
    """A hashable, order-free form of a ``{knob_type: value}`` choice."""
    return tuple(sorted((str(k), int(v)) for k, v in knobs.items()))


def known_bad(kind: str, q: torch.Tensor, k: torch.Tensor, causal: bool,
              square: bool) -> str | None:
    """Why cuDNN must not serve a shape although it builds a graph for it, or None.

    Filled from the single-GPU kernel checks (``python -m cp_attention.kernel_check``): every
    shape listed here was measured wrong against the float64 reference. None are known.
    """
    return None


def release_all() -> None:
    """Release the graphs and handles of every cuDNN backend object (run at exit)."""
    for instance in list(_INSTANCES):
        instance.release()
    gc.collect()


def _padded_stats(lse: torch.Tensor, cu_q: torch.Tensor, max_q: int, cache: dict | None):
    """Ragged ``[T, H]`` LSE to padded ``[B, H, S, 1]`` through a cached flat index."""
    tokens, heads = lse.shape
    b = cu_q.numel() - 1
    key = ("cudnn_pad_index", heads, max_q)
    index = cache.get(key) if cache is not None else None
    if index is None:
        cu = cu_q.long()
        lengths = cu[1:] - cu[:-1]
        ids = torch.arange(b, device=lse.device)
        seq = torch.repeat_interleave(ids, lengths, output_size=tokens)
        pos = torch.arange(tokens, device=lse.device) - cu[seq]
        h = torch.arange(heads, device=lse.device)
        index = ((seq[:, None] * heads + h[None, :]) * max_q + pos[:, None]).reshape(-1)
        if cache is not None:
            cache[key] = index
    padded = lse.new_zeros(b * heads * max_q)
    padded.index_copy_(0, index, lse.reshape(-1))
    return padded.view(b, heads, max_q, 1)
