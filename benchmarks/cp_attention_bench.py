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
    args = parser.parse_args()
    if args.cpu and args.seqlens == [8192, 4096, 2048, 2048]:
        args.seqlens, args.heads, args.dim = [64, 32, 16, 16], 2, 8
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(2, port, args), nprocs=2, start_method="spawn")


if __name__ == "__main__":
    main()
