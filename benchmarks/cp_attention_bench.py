"""Benchmark of the bundled CP attention on the reference workload (DESIGN.md).

2 ranks, P2P CP, THD, causal, bf16, 16 heads x 128, seqlens 8192/4096/2048/2048, 4 attention
layers forward + backward per iteration. Arms, interleaved (ABBA order) for ``--iters``
iterations each, timed with CUDA events; the step time of an iteration is the slower rank's:

* ``bundled fixed (<kernel>)``: :func:`cp_attention.cp_attn` with each available local kernel;
* ``bundled broken switches``: TE's identity-based padding path and unconditional zero-fill;
* ``single GPU no CP (<kernel>)``: the same kernel doing the whole workload on one GPU (both
  GPUs run it independently), for CP efficiency = single / (2 x CP);
* TE arms when ``transformer_engine`` imports: stock (value-equal clone, ``pad_between_seqs``
  None), explicit ``pad_between_seqs=False``, and :class:`AdaptedDotProductAttention`.

Kernel launches per layer (forward + backward) come from one profiled iteration per arm, as do
the kernels launched inside metadata and zero-fill helper ranges. FLOPs per layer: 3.5 x 2 x
sum(s^2) x H x D (causal forward + backward).

Run: ``NCCL_NVLS_ENABLE=0 PYTHONPATH=. python benchmarks/cp_attention_bench.py``
(``--cpu`` = tiny gloo smoke run with the math kernel).

``--floor`` (one GPU, no process group): the per-rank compute floor. For each rank of a cp=2
and cp=4 plan it runs exactly that rank's forward + backward local work
(:func:`cp_attention.attention.rank_local_work`: every ring step's kernels, merges, corrections)
with the other ranks' KV blocks and dK/dV handed in as local tensors
(:class:`cp_attention.ring.LoopbackRing`), under several :class:`~cp_attention.attention.Tuning`
arms interleaved in one process (ABBA), plus the whole workload on one GPU through the same
path. Per rank and arm: CUDA-event time, GPU kernel time and launches (median of
``--profile-reps`` profiled iterations, by kernel family), TFLOP/s over the kernel time, and the
ratio to the ideal split of the one-GPU kernel time. Arms ``all_gather`` and ``graphs,
all_gather`` run the all-gather comm instead (a :class:`~cp_attention.ring.LoopbackGather`
hands over the gathered K/V and the peers' dK/dV); a per-call table times each cuDNN call of
both comms alone. ``--floor --cpu`` is a tiny CPU smoke run of the same code.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cp_attention import PackedBatch, cp_attn, partition_for_rank
from cp_attention.graphs import StepGraphs
from cp_attention.local_attention import cudnn_available

HELPER_RANGES = ("cp_attention.metadata_step", "get_cu_seqlens_on_cp_rank",
                 "cp_attention.grad_zero_fill")


def _offsets(lengths: list[int]) -> list[int]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


class Workload:
    """Per-layer inputs (full batch and this rank's part) and the step functions of the arms."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int, device: torch.device):
        self.args, self.rank, self.world, self.device = args, rank, world, device
        self.cu = _offsets(args.seqlens)
        self.meta = PackedBatch.from_cu_seqlens(self.cu, cp_size=world, device=device)
        self.single = PackedBatch.from_cu_seqlens(self.cu, cp_size=1, device=device)
        gen = torch.Generator().manual_seed(1234)
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
        total = self.cu[-1]
        self.full, self.local = [], []
        for _ in range(args.layers):
            layer = {n: torch.randn(total, args.heads, args.dim, generator=gen).to(device, dtype)
                     for n in ("q", "k", "v", "dout")}
            self.full.append({n: t.requires_grad_(n != "dout") for n, t in layer.items()})
            self.local.append({n: partition_for_rank(t.detach(), self.meta, rank).contiguous()
                               .requires_grad_(n != "dout") for n, t in layer.items()})

    def bundled(self, single: bool, **kw) -> Callable[[], None]:
        layers = self.full if single else self.local
        meta = self.single if single else self.meta

        def step() -> None:
            outs = [cp_attn(t["q"], t["k"], t["v"], meta, **kw) for t in layers]
            inputs = [t[n] for t in layers for n in ("q", "k", "v")]
            torch.autograd.grad(outs, inputs, [t["dout"] for t in layers])

        return step

    def te(self, mode: str) -> Callable[[], None]:
        """A TE arm: ``stock``, ``explicit_false`` or ``adapter``."""
        import transformer_engine.pytorch as te

        from cp_attention.te_adapter import AdaptedDotProductAttention

        cls = AdaptedDotProductAttention if mode == "adapter" else te.DotProductAttention
        stream = torch.cuda.Stream()
        modules = [cls(self.args.heads, self.args.dim, qkv_format="thd",
                       attn_mask_type="padding_causal", layer_number=i + 1,
                       cp_group=dist.group.WORLD, cp_global_ranks=list(range(self.world)),
                       cp_stream=stream, cp_comm_type="p2p") for i in range(self.args.layers)]
        cu = torch.tensor(self.cu, dtype=torch.int32, device=self.device)
        clone = cu.clone()  # value-equal, different object: what data loaders usually hand over
        max_len = max(self.args.seqlens)
        kwargs = {"cu_seqlens_q": cu, "cu_seqlens_kv": cu, "cu_seqlens_q_padded": clone,
                  "cu_seqlens_kv_padded": clone, "max_seqlen_q": max_len,
                  "max_seqlen_kv": max_len}
        if mode == "explicit_false":
            kwargs["pad_between_seqs"] = False
        if mode == "adapter":
            kwargs = {"packed_batch": self.meta}

        def step() -> None:
            outs = [m(t["q"], t["k"], t["v"], **kwargs) for m, t in zip(modules, self.local,
                                                                         strict=True)]
            inputs = [t[n] for t in self.local for n in ("q", "k", "v")]
            grads = [t["dout"].reshape(o.shape) for o, t in zip(outs, self.local, strict=True)]
            torch.autograd.grad(outs, inputs, grads)

        return step


def build_arms(w: Workload) -> dict[str, Callable[[], None]]:
    kernels = w.args.kernels or (["math"] if w.device.type == "cpu" else
                                 ["flash"] + (["cudnn"] if cudnn_available() else []))
    arms: dict[str, Callable[[], None]] = {}
    for k in kernels:
        arms[f"bundled fixed ({k})"] = w.bundled(False, backend=k)
    best = kernels[-1]
    arms[f"bundled fixed, backward KV ring ({best})"] = w.bundled(False, backend=best,
                                                                  save_remote_kv=False)
    arms[f"bundled fixed, all_gather ({best})"] = w.bundled(False, backend=best, comm="all_gather")
    arms[f"bundled broken switches ({kernels[-1]})"] = w.bundled(
        False, backend=kernels[-1], broken_identity_padding=True, broken_always_zero_fill=True)
    for k in kernels:
        arms[f"single GPU no CP ({k})"] = w.bundled(True, backend=k)
    if w.device.type == "cuda" and not w.args.no_te:
        try:
            import transformer_engine.pytorch  # noqa: F401
        except Exception as exc:
            if w.rank == 0:
                print(f"TE arms skipped: transformer_engine does not import ({exc})")
        else:
            for mode in ("stock", "explicit_false", "adapter"):
                arms[f"TE {mode}"] = w.te(mode)
    return arms


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_kernels(fn: Callable[[], None], device: torch.device, trace: Path | None) -> dict:
    """Kernel launches of one call, total and inside the TE-style helper ranges."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        _sync(device)
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    events = prof.events()
    total = sum(1 for e in events if e.device_type == DeviceType.CUDA)

    def under(e) -> int:
        return len(getattr(e, "kernels", [])) + sum(under(c) for c in e.cpu_children)

    helpers = {name: 0 for name in HELPER_RANGES}
    ranges = {name: 0 for name in HELPER_RANGES}
    for e in events:
        if e.name in helpers and e.device_type == DeviceType.CPU:
            ranges[e.name] += 1
            helpers[e.name] += under(e)
    return {"kernels": total, "helper_kernels": helpers, "helper_ranges": ranges}


def measure(arms: dict[str, Callable[[], None]], w: Workload) -> dict[str, list[float]]:
    """Interleaved CUDA-event (or wall-clock on CPU) timings, ABBA order."""
    names = list(arms)
    times: dict[str, list[float]] = {n: [] for n in names}
    for it in range(w.args.iters):
        order = names if it % 2 == 0 else names[::-1]
        for name in order:
            _sync(w.device)
            dist.barrier()
            if w.device.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                arms[name]()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                arms[name]()
                times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    device = torch.device("cpu") if args.cpu else torch.device("cuda", rank)
    if not args.cpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if args.cpu else "nccl", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300),
                            device_id=None if args.cpu else device)
    try:
        w = Workload(args, rank, world, device)
        arms = build_arms(w)
        for _ in range(args.warmup):
            for fn in arms.values():
                fn()
        trace_dir = Path(args.trace_dir) if args.trace_dir else None
        counts = {}
        for i, (name, fn) in enumerate(arms.items()):
            trace = trace_dir / f"arm{i}_rank{rank}.json" if trace_dir and rank == 0 else None
            counts[name] = count_kernels(fn, device, trace)
        times = measure(arms, w)
        gathered: list = [None] * world
        dist.all_gather_object(gathered, times)
        if rank == 0:
            step = {n: [max(r[n][i] for r in gathered) for i in range(args.iters)] for n in arms}
            report(step, counts, args)
    finally:
        dist.destroy_process_group()


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))]


def report(step: dict[str, list[float]], counts: dict, args: argparse.Namespace) -> None:
    flops = 3.5 * 2 * sum(s * s for s in args.seqlens) * args.heads * args.dim * args.layers
    rows = []
    for name, xs in step.items():
        med = statistics.median(xs)
        gpus = 1 if name.startswith("single") else 2
        helper = counts[name]["helper_kernels"]
        rows.append({
            "arm": name, "median_ms": med, "p10_ms": _pct(xs, 0.1), "p90_ms": _pct(xs, 0.9),
            "mean_ms": statistics.fmean(xs), "n": len(xs),
            "kernels_per_layer": counts[name]["kernels"] / args.layers,
            "metadata_kernels": helper["cp_attention.metadata_step"],
            "te_helper_ranges": counts[name]["helper_ranges"]["get_cu_seqlens_on_cp_rank"],
            "zero_fill_kernels": helper["cp_attention.grad_zero_fill"],
            "tflops_per_gpu": flops / gpus / (med * 1e-3) / 1e12,
        })
    nccl = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    print(f"workload: cp=2 seqlens={args.seqlens} heads={args.heads} dim={args.dim} "
          f"layers={args.layers} iters={args.iters} (step = slower rank, ms); env {nccl}")
    print("| arm | median ms | p10 | p90 | mean | kernels/layer fwd+bwd | metadata kernels/iter "
          "| zero-fill kernels/iter | TFLOP/s per GPU |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        # TE's helpers open no record_function range, so these counters see nothing for TE arms;
        # `cptrace analyze` on a captured TE bundle attributes them through Python frames.
        te = r["arm"].startswith("TE")
        meta = "n/a" if te else r["metadata_kernels"]
        zero = "n/a" if te else r["zero_fill_kernels"]
        print(f"| {r['arm']} | {r['median_ms']:.2f} | {r['p10_ms']:.2f} | {r['p90_ms']:.2f} | "
              f"{r['mean_ms']:.2f} | {r['kernels_per_layer']:.1f} | {meta} | "
              f"{zero} | {r['tflops_per_gpu']:.0f} |")
    by = {r["arm"]: r for r in rows}
    for name, r in by.items():
        if name.startswith("bundled fixed"):
            kernel = name[len("bundled fixed "):]
            single = by.get(f"single GPU no CP {kernel}")
            if single:
                eff = single["median_ms"] / (2 * r["median_ms"])
                print(f"CP efficiency {kernel}: {single['median_ms']:.2f} / (2 x "
                      f"{r['median_ms']:.2f}) = {eff:.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows,
                                               "samples": step}, indent=1))


# -- single-GPU per-rank compute floor (--floor) ----------------------------------------------
_OFF = {"fused_merge": False, "in_place": False, "remote_rows": False, "dq_rows": False,
        "joint_bwd": False, "dq_fp32": False, "peer_sum": False}
_DAY1 = {**_OFF, "fused_merge": True, "in_place": True, "remote_rows": True}
FLOOR_ARMS = {
    "before": _OFF,
    "fused merge only": {**_OFF, "fused_merge": True},
    "in place only": {**_OFF, "in_place": True},
    "remote rows only": {**_OFF, "remote_rows": True},
    "after, no remote rows": {**_DAY1, "remote_rows": False},
    # Day 2: each new switch alone on top of day 1's three; "after" = the defaults.
    "day-1 after": _DAY1,
    "day 1 + dq rows": {**_DAY1, "dq_rows": True},
    "day 1 + joint bwd": {**_DAY1, "joint_bwd": True},
    "after": {**_DAY1, "dq_rows": True, "peer_sum": True},
    "after + joint bwd": {**_DAY1, "dq_rows": True, "joint_bwd": True, "peer_sum": True},
    # Day 3: float32 dQ from cuDNN (no dQ conversion kernel), the steps' dQ summed once.
    "after + dq fp32": {**_DAY1, "dq_rows": True, "dq_fp32": True, "peer_sum": True},
    # Issue 29: the peers' dK/dV added one by one (the defaults before peer_sum).
    "after, no peer sum": {**_DAY1, "dq_rows": True},
}
#: Arms that change the local kernel instead: (tuning arm, backend). Day 1's run 2 had
#: "after, cudnn autotune" with heuristics modes A + FALLBACK: no gain, 1 plan per shape; the
#: autotune backend now also asks mode B.
FLOOR_KERNEL_ARMS = {"after, flash kernel": ("after", "flash"),
                     "after, cudnn autotune": ("after", "cudnn_autotune"),
                     "after + dq fp32, cudnn autotune": ("after + dq fp32", "cudnn_autotune")}
#: Arms that replay each rank's step from a CUDA graph (cp_attention.graphs, bound to the
#: layer's tensors): (tuning arm, backend; None = the --kernels choice).
FLOOR_GRAPH_ARMS = {"graphs": ("after", None), "graphs, flash kernel": ("after", "flash"),
                    "graphs, no peer sum": ("after, no peer sum", None),
                    "graphs, all_gather": ("after", None)}
#: Arms of the all-gather comm (issue 29: one or two calls per rank over the gathered KV in
#: sequence order instead of one call per ring step), eager and from graphs.
FLOOR_ALL_GATHER_ARMS = {"all_gather": ("after", None)}
#: Arms whose rank runs the all-gather comm (the others run the P2P ring).
ALL_GATHER_ARMS = {"all_gather", "graphs, all_gather"}


def _call_pairs(call) -> int:
    """Query-key pairs one planned call attends (bottom-right causal when causal)."""
    lq = (call.cu_q[1:] - call.cu_q[:-1]).long().cpu()
    lk = (call.cu_k[1:] - call.cu_k[:-1]).long().cpu()
    if not call.causal:
        return int((lq * lk).sum())
    return int((lq * lk - lq * (lq - 1) // 2).sum())


def _kernel_family(name: str) -> str:
    n = name.lower()
    if "triton" in n or "merge_rows" in n:
        return "fused merge (triton)"
    if "flash" in n and "pytorch" in n:
        return "flash attention"
    if any(x in n for x in ("cudnn", "sm90", "fmha", "sdpa", "fprop", "bprop", "dgrad", "wgrad")):
        return "cuDNN attention"
    if "gather" in n or "index" in n or "scatter" in n:
        return "gather/scatter/index"
    if "memset" in n:
        return "memset"
    if "memcpy" in n:
        return "memcpy"
    if "copy" in n:
        return "copy/cast"
    return "elementwise/other"


def _profile_kernels(fn, device) -> dict:
    """GPU activity of one call: kernel count and time, by family (Kineto trace, us)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        prof.export_chrome_trace(fh.name)
        events = json.loads(Path(fh.name).read_text())["traceEvents"]
    fams: dict[str, list[float]] = {}
    names: dict[str, list[float]] = {}
    launches, busy = 0, 0.0
    for e in events:
        cat = e.get("cat", "")
        if cat not in ("kernel", "gpu_memset", "gpu_memcpy"):
            continue
        fam = _kernel_family(e["name"] if cat == "kernel" else cat)
        entry = fams.setdefault(fam, [0, 0.0])
        entry[0] += 1
        entry[1] += float(e.get("dur", 0.0))
        per_name = names.setdefault(e["name"][:110], [0, 0.0])
        per_name[0] += 1
        per_name[1] += float(e.get("dur", 0.0))
        busy += float(e.get("dur", 0.0))
        launches += 1
    top = dict(sorted(names.items(), key=lambda x: -x[1][1])[:14])
    return {"launches": launches, "busy_us": busy, "families": fams, "kernels": top}


def _median_profile(fn, device, reps: int) -> dict:
    """The profiled iteration of median GPU busy time among ``reps`` (one is noisy)."""
    runs = sorted((_profile_kernels(fn, device) for _ in range(max(reps, 1))),
                  key=lambda p: p["busy_us"])
    return runs[len(runs) // 2]


def _floor_inputs(args, cp: int, device, dtype):
    """The reference workload's layers, each rank's local tensors and its loopback inputs."""
    cu = _offsets(args.seqlens)
    meta = PackedBatch.from_cu_seqlens(cu, cp_size=cp, device=device)
    gen = torch.Generator().manual_seed(1234)
    total = cu[-1]
    layers = []
    for _ in range(args.layers):
        full = {n: torch.randn(total, args.heads, args.dim, generator=gen).to(device, dtype)
                for n in ("q", "k", "v", "dout")}
        local = {n: [partition_for_rank(t, meta, r).contiguous() for r in range(cp)]
                 for n, t in full.items()}
        # What the other ranks send back for our KV block: random (never zeros) at the rows
        # the sender's step read, zero elsewhere (so arms that add whole blocks agree).
        dkv = [[[_peer_grad(local["k"][r], meta, r, step),
                 _peer_grad(local["v"][r], meta, r, step)]
                for step in range(1, cp)] for r in range(cp)]
        # What the all-gather would return (every rank's block in rank order).
        local["gathered"] = [torch.cat(local["k"]), torch.cat(local["v"])]
        layers.append((local, dkv))
    return meta, layers


def _peer_grad(like: torch.Tensor, meta, owner: int, step: int) -> torch.Tensor:
    """A random gradient for ``owner``'s block from rank ``owner + step``, zero off its rows."""
    call = meta.calls_for("p2p", True, (owner + step) % meta.cp_size)[step]
    grad = torch.zeros_like(like)
    if call is not None:
        rows = call.k_rows
        noise = torch.randn_like(like)
        if rows.index is None:
            grad[rows.start : rows.stop] = noise[rows.start : rows.stop]
        else:
            grad[rows.index] = noise[rows.index]
    return grad


def _loopback(local: dict, dkv, meta, rank: int, comm: str):
    """The loopback of ``comm`` for ``rank`` (None at cp = 1)."""
    from cp_attention.ring import LoopbackGather, LoopbackRing

    cp = meta.cp_size
    if cp == 1:
        return None
    if comm == "all_gather":
        return LoopbackGather(rank, cp, local["gathered"], dkv[rank])
    kv = [[local["k"][(rank - i) % cp], local["v"][(rank - i) % cp]] for i in range(1, cp)]
    return LoopbackRing(rank, cp, kv, dkv[rank])


def _rank_fn(meta, layers, rank: int, tuning, backend: str | None, graphs=None,
             comm: str = "p2p"):
    from cp_attention.attention import rank_local_work

    # The loopbacks are built once: a bound graph's key is the tensors (the loopback's too).
    rings = [_loopback(local, dkv, meta, rank, comm) for local, dkv in layers]

    def run() -> None:
        for (local, _), ring in zip(layers, rings, strict=True):
            if ring is not None:
                ring.sent.clear()
            rank_local_work(local["q"][rank], local["k"][rank], local["v"][rank],
                            local["dout"][rank], meta, rank, ring, causal=True, backend=backend,
                            tuning=tuning, graphs=graphs, comm=comm)

    return run


def run_floor(args: argparse.Namespace) -> None:
    """Per-rank compute floor of the P2P step on one device (see the module docstring)."""
    from cp_attention.attention import Tuning
    from cp_attention.kernel_check import versions
    from cp_attention.local_attention import fallback_counts

    device = torch.device("cpu") if args.cpu else torch.device("cuda")
    dtype = torch.float32 if args.cpu else torch.bfloat16
    backend = (args.kernels or [None])[0]
    arms = {n: (Tuning(**kw), backend) for n, kw in FLOOR_ARMS.items()
            if not args.arms or n in args.arms}
    if device.type == "cuda":
        arms.update({n: (Tuning(**FLOOR_ARMS[a]), b) for n, (a, b) in FLOOR_KERNEL_ARMS.items()
                     if not args.arms or n in args.arms})
    graph_arms = {n for n in FLOOR_GRAPH_ARMS if not args.arms or n in args.arms}
    if args.cpu:
        graph_arms -= {"graphs, flash kernel"}
    arms.update({n: (Tuning(**FLOOR_ARMS[FLOOR_GRAPH_ARMS[n][0]]),
                     FLOOR_GRAPH_ARMS[n][1] or backend) for n in graph_arms})
    arms.update({n: (Tuning(**FLOOR_ARMS[a]), b or backend)
                 for n, (a, b) in FLOOR_ALL_GATHER_ARMS.items() if not args.arms or n in args.arms})
    # One cache per graph arm, large enough for every (cp, rank, layer) graph of the run.
    caches = {n: StepGraphs(capacity=4096) for n in graph_arms}
    if device.type == "cuda":
        for key, value in versions().items():
            print(f"{key}: {value}")
    fns: dict[tuple[str, int, int], Callable[[], None]] = {}
    flops: dict[tuple[int, int], float] = {}
    for cp in [1, *args.floor_cp]:
        meta, layers = _floor_inputs(args, cp, device, dtype)
        for rank in range(cp):
            # The same query-key pairs under either comm (tests/cp_attention checks it).
            pairs = sum(_call_pairs(c) for c in meta.calls_for("p2p", True, rank)
                        if c is not None)
            flops[(cp, rank)] = 3.5 * 4 * pairs * args.heads * args.dim * args.layers
            for arm, (tuning, kernel) in arms.items():
                comm = "all_gather" if arm in ALL_GATHER_ARMS else "p2p"
                fns[(arm, cp, rank)] = _rank_fn(meta, layers, rank, tuning, kernel,
                                                caches.get(arm), comm)
    for key, fn in list(fns.items()):
        try:
            for _ in range(args.warmup):
                fn()
            _sync(device)
        except Exception as exc:  # an arm that cannot run is reported, the others still run
            print(f"arm {key} dropped: {type(exc).__name__}: {exc}")
            del fns[key]
    _print_numerics(args, device, dtype, arms)
    times: dict[tuple[str, int, int], list[float]] = {key: [] for key in fns}
    names = list(fns)
    for it in range(args.iters):
        for key in names if it % 2 == 0 else names[::-1]:
            _sync(device)
            if device.type == "cuda":
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                fns[key]()
                end.record()
                end.synchronize()
                times[key].append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fns[key]()
                times[key].append((time.perf_counter() - t0) * 1e3)
    prof = {key: _median_profile(fn, device, args.profile_reps) for key, fn in fns.items()} \
        if device.type == "cuda" else {}
    rows = []
    for (arm, cp, rank), xs in times.items():
        p = prof.get((arm, cp, rank), {"launches": 0, "busy_us": float("nan"), "families": {}})
        one_gpu = prof.get((arm, 1, 0), {"busy_us": float("nan")})["busy_us"]
        kernel_ms = p["busy_us"] / 1e3
        rows.append({
            "arm": arm, "cp": cp, "rank": rank, "event_ms": statistics.median(xs),
            "kernel_ms": kernel_ms, "launches_per_layer": p["launches"] / args.layers,
            "tflops": flops[(cp, rank)] / (kernel_ms * 1e-3) / 1e12 if kernel_ms else 0.0,
            "ratio_to_ideal": kernel_ms / (one_gpu / 1e3 / cp) if one_gpu == one_gpu else None,
            "families": p["families"],
        })
    _print_floor(rows, args)
    for arm, cache in caches.items():
        reasons = sorted(set(cache.failed.values())) or "none"
        print(f"graph cache {arm!r}: {cache.stats}; capture failures: {reasons}")
    top = [(arm, cp, rank) for arm in ("after", "after + dq fp32", "after, cudnn autotune",
                                       "after + dq fp32, cudnn autotune")
           for cp, rank in ((2, 0), (2, 1))] + [("after", 1, 0)]
    for key in top:
        if key in prof:
            print(f"top kernels, arm {key[0]!r} cp={key[1]} rank={key[2]} (launches, ms/iter):")
            for name, (count, us) in prof[key]["kernels"].items():
                print(f"  {count:4d} {us / 1e3:7.3f}  {name}")
    if device.type == "cuda":
        _print_autotune()
        _per_call_table(args, device, dtype)
        _comm_call_table(args, device, dtype)
    if device.type == "cuda" and args.options:
        _options_table(args, device, dtype)
    print(f"fallbacks: {fallback_counts() or 'none'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows,
                                               "samples": {"|".join(map(str, k)): v
                                                           for k, v in times.items()}},
                                              indent=1))


def _print_numerics(args, device, dtype, arms) -> None:
    """Each arm's out/dQ/dK/dV of one layer vs the 'before' arm (numerics unchanged)."""
    from cp_attention.attention import rank_local_work

    if "before" not in arms:
        return
    print("| arm | cp | rank | max abs diff vs before, relative to max abs (out, dq, dk, dv) |")
    print("|---|---|---|---|")
    for cp in args.floor_cp:
        meta, layers = _floor_inputs(args, cp, device, dtype)
        local, dkv = layers[0]
        for rank in range(cp):
            results = {}
            for arm, (tuning, kernel) in arms.items():
                comm = "all_gather" if arm in ALL_GATHER_ARMS else "p2p"
                ring = _loopback(local, dkv, meta, rank, comm)
                try:
                    res = rank_local_work(local["q"][rank], local["k"][rank], local["v"][rank],
                                          local["dout"][rank], meta, rank, ring, causal=True,
                                          backend=kernel, tuning=tuning, comm=comm)
                except Exception as exc:
                    print(f"| {arm} | {cp} | {rank} | failed: {type(exc).__name__}: {exc} |")
                    continue
                results[arm] = [res[0], *res[2:]]
            base = results.get("before")
            for arm, res in results.items():
                if arm == "before" or base is None:
                    continue
                diffs = [float((a.float() - b.float()).abs().max() / b.float().abs().max())
                         for a, b in zip(res, base, strict=True)]
                print(f"| {arm} | {cp} | {rank} | {', '.join(f'{d:.1e}' for d in diffs)} |")


def _time_ms(fn, device, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize(device)
    xs = []
    for _ in range(reps):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn()
        end.record()
        end.synchronize()
        xs.append(start.elapsed_time(end))
    return statistics.median(xs)


def _per_call_table(args: argparse.Namespace, device, dtype) -> None:
    """Each planned call of the cp=2 ranks (and the one-GPU call) alone: fwd+bwd per kernel."""
    from cp_attention.local_attention import get_backend

    print("| cp | rank | step | q rows x k rows (segments) | causal | kernel | layout | "
          "fwd+bwd ms | TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    scale = args.dim ** -0.5
    for cp in (1, 2):
        meta, layers = _floor_inputs(args, cp, device, dtype)
        local = layers[0][0]
        for rank in range(cp):
            for step, call in enumerate(meta.calls_for("p2p", True, rank)):
                if call is None:
                    continue
                owner = (rank - step) % cp
                q, dout = local["q"][rank], local["dout"][rank]
                k, v = local["k"][owner], local["v"][owner]
                fl = 3.5 * 4 * _call_pairs(call) * args.heads * args.dim
                for name in ("cudnn", "flash"):
                    kernel = get_backend(device, name)
                    layouts = ["packed"] + (["in place"] if call.in_place and call.gathers
                                            and hasattr(kernel, "fwd_in_place") else [])
                    for layout in layouts:
                        def run(kernel=kernel, layout=layout, call=call, q=q, k=k, v=v,
                                dout=dout) -> None:
                            if layout == "in place":
                                res = kernel.fwd_in_place(q, k, v, call, scale)
                                if res is None:
                                    raise RuntimeError("in-place call declined")
                                kernel.bwd_in_place(dout, q, k, v, *res, call, scale)
                                return
                            qp, kp, vp = (call.q_rows.take(q), call.k_rows.take(k),
                                          call.k_rows.take(v))
                            a = (call.cu_q, call.cu_k, call.max_q, call.max_k, call.causal,
                                 scale, call.square)
                            out, lse = kernel.fwd(qp, kp, vp, *a, cache=call.cache)
                            kernel.bwd(call.q_rows.take(dout), qp, kp, vp, out, lse, *a,
                                       cache=call.cache)

                        try:
                            ms = _time_ms(run, device)
                        except RuntimeError as exc:
                            print(f"| {cp} | {rank} | {step} | - | - | {name} | {layout} | "
                                  f"{exc} | - |")
                            continue
                        print(f"| {cp} | {rank} | {step} | {call.q_rows.count} x "
                              f"{call.k_rows.count} ({call.cu_q.numel() - 1}) | "
                              f"{call.causal} | {name} | {layout} | {ms:.3f} | "
                              f"{fl / (ms * 1e-3) / 1e12:.0f} |")


def _comm_call_table(args: argparse.Namespace, device, dtype) -> None:
    """Each cuDNN call of every rank at each ``--floor-cp`` under both comms, alone: P2P one
    per ring step (on the owner's block), all-gather one or two (on the gathered KV in
    sequence order): forward + backward ms and TFLOP/s, and the sum per rank."""
    from cp_attention.local_attention import get_backend

    kernel = get_backend(device, "cudnn").primary
    scale = args.dim ** -0.5
    print("| comm | cp | rank | call | q rows x k rows (segments) | causal | layout | "
          "fwd+bwd ms | TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cp in args.floor_cp:
        meta, layers = _floor_inputs(args, cp, device, dtype)
        local = layers[0][0]
        for comm in ("p2p", "all_gather"):
            for rank in range(cp):
                total_ms, total_fl = 0.0, 0.0
                if comm == "all_gather":
                    to_seq = meta.gather_order(True, rank).to_seq
                    kseq, vseq = (t if to_seq is None else t.index_select(0, to_seq)
                                  for t in local["gathered"])
                for index, call in enumerate(meta.calls_for(comm, True, rank)):
                    if call is None:
                        continue
                    if comm == "p2p":
                        owner = (rank - index) % cp
                        k, v = local["k"][owner], local["v"][owner]
                    else:
                        k, v = kseq, vseq
                    tensors = (local["q"][rank], k, v, local["dout"][rank])
                    fl = 3.5 * 4 * _call_pairs(call) * args.heads * args.dim
                    try:
                        fwd, bwd, layout = _step_call_fns(kernel, None, call, tensors, scale,
                                                          index if comm == "p2p" else 1)
                        ms = _time_ms(lambda fwd=fwd, bwd=bwd: (fwd(), bwd()), device)
                    except Exception as exc:
                        print(f"| {comm} | {cp} | {rank} | {index} | - | - | - | "
                              f"{type(exc).__name__}: {str(exc)[:100]} | - |")
                        continue
                    total_ms += ms
                    total_fl += fl
                    print(f"| {comm} | {cp} | {rank} | {index} | {call.q_rows.count} x "
                          f"{call.k_rows.count} ({call.cu_q.numel() - 1}) | {call.causal} | "
                          f"{layout} | {ms:.3f} | {fl / (ms * 1e-3) / 1e12:.0f} |")
                if total_ms:
                    print(f"| {comm} | {cp} | {rank} | all | - | - | - | {total_ms:.3f} | "
                          f"{total_fl / (total_ms * 1e-3) / 1e12:.0f} |")


def _print_autotune() -> None:
    """What ``cudnn_autotune`` chose per graph: plans timed, the default (plan 0) and the
    kept plan with their names and times, and the knob space of the top plan's engine."""
    from cp_attention.local_attention import get_backend

    here = torch.device("cuda", torch.cuda.current_device())  # the key kernels use
    tuned = getattr(get_backend(here, "cudnn_autotune"), "primary", None)
    for key, (count, best, ms) in getattr(tuned, "tuned", {}).items():
        names = tuned.plan_names.get(key, [])

        def name(i: int, names: list[str] = names) -> str:
            return names[i] if i < len(names) else "?"

        tokens = f" tokens={key[3][0]}" if key[0] == "bwd" else ""
        dq = f" dq={key[15]}" if key[0] == "bwd" else ""
        gain = (1 - ms[best] / ms[0]) * 100 if ms and ms[0] > 0 else float("nan")
        print(f"autotune {key[0]} b={key[2]}{tokens} max_q={key[9]} max_k={key[10]} "
              f"causal={key[11]}{dq}: {count} plans; plan 0 {name(0)!r} {ms[0]:.3f} ms, kept "
              f"{best} {name(best)!r} {ms[best]:.3f} ms ({gain:+.1f}% faster)")
        ranked = sorted((t, i) for i, t in enumerate(ms) if t != float("inf"))[:6]
        print("    fastest: " + ", ".join(f"{i}:{name(i)} {t:.3f}" for t, i in ranked))
        space = tuned.knob_space.get(key)
        if space:
            print("    knob space (type, min, max, stride): " + ", ".join(map(str, space)))


def _step_call_fns(kernel, dq_dtype, call, tensors, scale: float, step: int):
    """``(fwd, bwd, layout)`` of one planned step call as the floor runs it (in place when
    the call gathers rows; a remote step's dK/dV and partial dQ not zeroed outside)."""
    q, k, v, dout = tensors
    in_place = call.in_place and call.gathers
    packed = (call.q_rows.take(q), call.k_rows.take(k), call.k_rows.take(v),
              call.q_rows.take(dout))
    a = (call.cu_q, call.cu_k, call.max_q, call.max_k, call.causal, scale, call.square)

    def fwd():
        if in_place:
            res = kernel.fwd_in_place(q, k, v, call, scale)
            if res is None:
                raise RuntimeError("in-place call declined")
            return res
        return kernel.fwd(*packed[:3], *a, cache=call.cache)

    out, lse = fwd()

    def bwd():
        if in_place:
            return kernel.bwd_in_place(dout, q, k, v, out, lse, call, scale, step == 0, False,
                                       dq_dtype)
        return kernel.bwd(packed[3], *packed[:3], out, lse, *a, cache=call.cache,
                          dq_dtype=dq_dtype)

    return fwd, bwd, "in place" if in_place else "packed"


def _options_table(args: argparse.Namespace, device, dtype) -> None:
    """Each cp=2 step call (and the one-GPU call) alone, forward and backward timed apart,
    under cuDNN graph options: the default graphs, a float32 dQ, the SDPA forward
    implementation forced (UNIFIED / COMPOSITE), and the autotuned plans (knob sweep); plus
    the backward's kernels with a 16-bit and a float32 dQ."""
    from cp_attention.cudnn_graph import CudnnGraphAttention
    from cp_attention.local_attention import get_backend

    base = get_backend(device, "cudnn").primary
    variants = {"default": (base, None),
                "dq fp32": (base, torch.float32),
                "fwd UNIFIED": (CudnnGraphAttention(fwd_implementation="UNIFIED"), None),
                "fwd COMPOSITE": (CudnnGraphAttention(fwd_implementation="COMPOSITE"), None),
                "autotune": (get_backend(device, "cudnn_autotune").primary, None),
                "autotune, dq fp32": (get_backend(device, "cudnn_autotune").primary,
                                      torch.float32)}
    print("| cp | rank | step | q rows x k rows | causal | layout | variant | fwd ms | bwd ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    scale = args.dim ** -0.5
    kernels_seen: list[str] = []
    for cp in (1, 2):
        meta, layers = _floor_inputs(args, cp, device, dtype)
        local = layers[0][0]
        for rank in range(cp):
            for step, call in enumerate(meta.calls_for("p2p", True, rank)):
                if call is None:
                    continue
                owner = (rank - step) % cp
                tensors = (local["q"][rank], local["k"][owner], local["v"][owner],
                           local["dout"][rank])
                for variant, (kernel, dq_dtype) in variants.items():
                    try:
                        fwd, bwd, layout = _step_call_fns(kernel, dq_dtype, call, tensors,
                                                          scale, step)
                        f_ms, b_ms = _time_ms(fwd, device), _time_ms(bwd, device)
                    except Exception as exc:
                        print(f"| {cp} | {rank} | {step} | - | - | - | {variant} | "
                              f"{type(exc).__name__}: {str(exc)[:120]} | - |")
                        continue
                    print(f"| {cp} | {rank} | {step} | {call.q_rows.count} x "
                          f"{call.k_rows.count} | {call.causal} | {layout} | {variant} | "
                          f"{f_ms:.3f} | {b_ms:.3f} |")
                    if variant in ("default", "dq fp32"):
                        p = _profile_kernels(bwd, device)
                        kernels_seen.append(f"cp={cp} rank={rank} step={step} {variant} bwd: " +
                                            "; ".join(f"{n[:60]} {us:.1f}us"
                                                      for n, (c, us) in p["kernels"].items()))
    print("backward kernels per call (name, GPU time):")
    for line in kernels_seen:
        print("  " + line)
    _print_autotune()


def _print_floor(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"floor: seqlens={args.seqlens} heads={args.heads} dim={args.dim} "
          f"layers={args.layers} iters={args.iters}; kernel time = GPU activity of the median "
          f"of {args.profile_reps} profiled iterations; ideal = one-GPU kernel time / cp "
          "(same arm)")
    print("| arm | cp | rank | event ms (median) | kernel ms | event / kernel | launches/layer "
          "| TFLOP/s | kernel / ideal split |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['ratio_to_ideal']:.2f}" if r["ratio_to_ideal"] is not None else "-"
        per = r["event_ms"] / r["kernel_ms"] if r["kernel_ms"] == r["kernel_ms"] and \
            r["kernel_ms"] > 0 else float("nan")
        print(f"| {r['arm']} | {r['cp']} | {r['rank']} | {r['event_ms']:.2f} | "
              f"{r['kernel_ms']:.2f} | {per:.2f} | {r['launches_per_layer']:.1f} | "
              f"{r['tflops']:.0f} | {ratio} |")
    print("| arm | cp | rank | kernel family | launches/iter | ms/iter |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        for fam, (count, us) in sorted(r["families"].items(), key=lambda x: -x[1][1]):
            print(f"| {r['arm']} | {r['cp']} | {r['rank']} | {fam} | {count} | "
                  f"{us / 1e3:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=lambda s: [int(x) for x in s.split(",")],
                        default=[8192, 4096, 2048, 2048])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--kernels", type=lambda s: s.split(","), default=None,
                        help="local kernels to compare (flash,cudnn); default: all available")
    parser.add_argument("--no-te", action="store_true", help="skip the Transformer Engine arms")
    parser.add_argument("--json", default=None, help="write rows and samples to this file")
    parser.add_argument("--trace-dir", default=None, help="write one Kineto trace per arm")
    parser.add_argument("--cpu", action="store_true", help="tiny gloo smoke run (math kernel)")
    parser.add_argument("--floor", action="store_true",
                        help="single-GPU per-rank compute floor (see module docstring)")
    parser.add_argument("--floor-cp", type=lambda s: [int(x) for x in s.split(",")],
                        default=[2, 4])
    parser.add_argument("--arms", type=lambda s: [a.strip() for a in s.split(";")],
                        default=None,
                        help="floor arms to run, ';'-separated (names hold commas; default: all)")
    parser.add_argument("--profile-reps", type=int, default=3,
                        help="floor: profiled iterations per arm; kernel time is their median")
    parser.add_argument("--options", action="store_true",
                        help="floor: also time each step call under cuDNN graph options")
    parser.add_argument("--options-only", action="store_true",
                        help="only the cuDNN graph options table (one GPU)")
    args = parser.parse_args()
    if args.options_only:
        _options_table(args, torch.device("cuda"), torch.bfloat16)
        return
    if args.cpu and args.seqlens == [8192, 4096, 2048, 2048]:
        args.seqlens, args.heads, args.dim = [64, 32, 16, 16], 2, 8
    if args.floor:
        run_floor(args)
        return
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(2, port, args), nprocs=2, start_method="spawn")


if __name__ == "__main__":
    main()
