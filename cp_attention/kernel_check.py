"""Single-device checks of the local kernels against the exact float64 math kernel.

Cases are planned kernel calls, built on the host with :class:`~cp_attention.PackedBatch`:

* hand-made packs with cp=1 (real padding between sequences, tail padding, a single sequence,
  sequences of length 1, many short sequences, GQA, head dims 64/128/256), causal and not;
* every per-step call of the CP plans for cp = 2, 4, 8 under DualChunkSwap and NoLoadBalance,
  P2P (every rank, every ring step) and all-gather, causal and not, over a reference-like pack
  and a padded one, de-duplicated by block shape.

Each case runs the kernel's packed call (rows gathered, as before) and, where the kernel has
one and the call allows it, its in-place call (whole buffers, offset addressing), forward and
backward, and compares out, LSE, dQ, dK, dV with the float64 math kernel on the same inputs
(max abs error over max abs reference value; LSE absolute). In place, gradient rows outside the
call must be exactly zero. Fresh random inputs per case.

``python -m cp_attention.kernel_check`` prints the versions and the table;
``tests/cp_attention/test_cp_local_kernels_gpu.py`` runs the same cases under pytest.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from cp_attention.local_attention import FALLBACKS, MathAttention, get_backend
from cp_attention.metadata import PackedBatch
from cp_attention.partition import pad_sequences_to_multiple, pad_to_multiple
from cp_attention.plan import AttnCall

#: bf16 operands: errors of a few eps (7.8e-3) relative to the largest value are expected;
#: masking or addressing mistakes give O(1) errors.
TOL = 3e-2
LSE_TOL = 2e-2


@dataclass(frozen=True)
class KernelCase:
    """One planned call and the buffers it reads."""

    name: str
    group: str
    call: AttnCall
    q_tokens: int
    k_tokens: int
    heads: int
    kv_heads: int
    dim: int
    seed: int


@dataclass
class CaseResult:
    """Errors of one case with one kernel in one layout."""

    case: str
    group: str
    kernel: str
    layout: str
    errors: dict[str, float] = field(default_factory=dict)
    zero_outside: bool = True
    fallback: str = ""
    error: str = ""
    #: Why the layout did not run (the kernel declined it; the packed call serves the shape).
    skipped: str = ""

    @property
    def ok(self) -> bool:
        if self.skipped:
            return True
        if self.error or not self.errors:
            return False
        bad = [n for n, e in self.errors.items() if not e <= (LSE_TOL if n == "lse" else TOL)]
        return not bad and self.zero_outside

    @property
    def worst(self) -> float:
        return max(self.errors.values(), default=float("nan"))


def _offsets(lengths: list[int]) -> list[int]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def _packs() -> list[tuple[str, list[int], list[int] | None, int, int, int]]:
    """(name, cu_seqlens, cu_seqlens_padded, heads, kv_heads, dim) with cp=1."""
    gen = torch.Generator().manual_seed(7)
    short = torch.randint(1, 41, (64,), generator=gen).tolist()
    between = _offsets([100, 200, 33, 77])
    packs: list[tuple[str, list[int], list[int] | None, int, int, int]] = [
        ("padding between sequences", between, pad_sequences_to_multiple(between, 64), 8, 8, 128),
        ("tail padding", _offsets([500, 277]), pad_to_multiple(_offsets([500, 277]), 128), 8, 8,
         128),
        ("single sequence", [0, 1000], None, 8, 8, 128),
        ("length-1 sequences", _offsets([1, 1, 5, 1, 1]), None, 8, 8, 128),
        ("length-1 sequences padded", _offsets([1, 1, 5, 1, 1]),
         pad_sequences_to_multiple(_offsets([1, 1, 5, 1, 1]), 8), 8, 8, 128),
        ("many short sequences", _offsets(short), None, 8, 8, 128),
        ("many short sequences padded", _offsets(short),
         pad_sequences_to_multiple(_offsets(short), 16), 8, 8, 128),
        ("GQA 16/4", _offsets([300, 129, 64]), None, 16, 4, 128),
        ("GQA 8/1 padded", between, pad_sequences_to_multiple(between, 64), 8, 1, 128),
    ]
    for dim in (64, 256):
        packs.append((f"head dim {dim}", between, pad_sequences_to_multiple(between, 64), 8, 8,
                      dim))
        packs.append((f"head dim {dim} GQA", _offsets([300, 129, 64]), None, 8, 2, dim))
    return packs


def _plan_packs(cp: int) -> list[tuple[str, list[int], list[int]]]:
    ref = _offsets([1024, 512, 256, 256])
    padded = _offsets([1000, 333, 130, 1])
    return [
        ("ref-like", ref, ref),
        ("padded", padded, pad_to_multiple(pad_sequences_to_multiple(padded, 2 * cp), 16,
                                           cp_size=cp)),
    ]


def _signature(call: AttnCall, q_tokens: int, k_tokens: int) -> tuple:
    return (tuple(call.cu_q.tolist()), tuple(call.cu_k.tolist()), call.causal, call.square,
            call.q_rows.start if call.q_rows.index is None else tuple(call.q_rows.index.tolist()),
            call.k_rows.start if call.k_rows.index is None else tuple(call.k_rows.index.tolist()),
            q_tokens, k_tokens)


def cases(cps: tuple[int, ...] = (2, 4, 8)) -> list[KernelCase]:
    """Every case, planned on the host (cheap: numpy over sequences)."""
    out: list[KernelCase] = []
    seed = 0
    for name, cu, cup, heads, kv_heads, dim in _packs():
        meta = PackedBatch.from_cu_seqlens(cu, cup, cp_size=1, strategy="no_load_balance")
        for causal in (True, False):
            call = meta.calls_for("p2p", causal, 0)[0]
            assert call is not None
            seed += 1
            out.append(KernelCase(f"{name}, {'causal' if causal else 'full'}", "packs", call,
                                  meta.local_tokens, meta.local_tokens, heads, kv_heads, dim,
                                  seed))
    for cp in cps:
        for strategy in ("dual_chunk_swap", "no_load_balance"):
            seen: set[tuple] = set()
            group = f"cp{cp} {strategy}"
            for pack, cu, cup in _plan_packs(cp):
                meta = PackedBatch.from_cu_seqlens(cu, cup, cp_size=cp, strategy=strategy)
                for comm in ("p2p", "all_gather"):
                    k_tokens = meta.local_tokens * (cp if comm == "all_gather" else 1)
                    for causal in (True, False):
                        for rank in range(cp):
                            for step, call in enumerate(meta.calls_for(comm, causal, rank)):
                                if call is None:
                                    continue
                                sig = _signature(call, meta.local_tokens, k_tokens)
                                if sig in seen:
                                    continue
                                seen.add(sig)
                                seed += 1
                                out.append(KernelCase(
                                    f"{pack} {comm} {'causal' if causal else 'full'} "
                                    f"rank {rank} step {step}", group, call, meta.local_tokens,
                                    k_tokens, 8, 8, 128, seed))
                # The one-call backward of a rank (its forward is checked with it).
                for (causal, rank), joint in meta.joint.items():
                    sig = _signature(joint.call, meta.local_tokens, joint.k_total)
                    if sig not in seen:
                        seen.add(sig)
                        seed += 1
                        out.append(KernelCase(
                            f"{pack} p2p joint bwd {'causal' if causal else 'full'} rank {rank}",
                            group, joint.call, meta.local_tokens, joint.k_total, 8, 8, 128,
                            seed))
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    if b.numel() == 0:
        return 0.0
    diff = (a.double() - b.double()).abs().max()
    return float(diff / b.double().abs().max().clamp_min(1e-30))


def _lse_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1.0))


#: Layouts of a kernel whose backward takes ``dq_dtype``: dQ asked for in float32.
FP32_DQ_LAYOUTS = ("packed, fp32 dQ", "in place, fp32 dQ")


def layouts_for(kernel) -> tuple[str, ...]:
    """Every layout ``kernel`` offers (fp32-dQ ones when its backward takes ``dq_dtype``)."""
    extra = FP32_DQ_LAYOUTS if getattr(kernel, "accepts_dq_dtype", False) else ()
    return ("packed", "in place", *extra)


def run_case(case: KernelCase, kernel, device: torch.device, dtype: torch.dtype,
             layouts: tuple[str, ...] = ("packed", "in place")) -> list[CaseResult]:
    """Run ``case`` with ``kernel`` (a local-attention object) and compare with float64 math.

    ``"..., fp32 dQ"`` layouts ask the backward for a float32 dQ and fail the row when a dQ of
    another dtype comes back without a fallback having served the call.
    """
    call = case.call.to(device)
    gen = torch.Generator().manual_seed(1000 + case.seed)

    def rand(tokens: int, heads: int, dim: int) -> torch.Tensor:
        return torch.randn(tokens, heads, dim, generator=gen).to(device, dtype)

    q = rand(case.q_tokens, case.heads, case.dim)
    k, v = (rand(case.k_tokens, case.kv_heads, case.dim) for _ in range(2))
    dout = rand(case.q_tokens, case.heads, case.dim)
    scale = case.dim ** -0.5
    qp, kp, vp, dop = call.q_rows.take(q), call.k_rows.take(k), call.k_rows.take(v), \
        call.q_rows.take(dout)
    math_kernel = MathAttention()
    args = (call.cu_q, call.cu_k, call.max_q, call.max_k, call.causal, scale, call.square)
    ref_out, ref_lse = math_kernel.fwd(qp.double(), kp.double(), vp.double(), *args)
    ref_grads = math_kernel.bwd(dop.double(), qp.double(), kp.double(), vp.double(), ref_out,
                                ref_lse, *args)
    results = []
    for layout in layouts:
        res = CaseResult(case.name, case.group, kernel.name, layout)
        before = Counter(FALLBACKS)
        fp32_dq = layout.endswith("fp32 dQ")
        extra = {"dq_dtype": torch.float32} if fp32_dq else {}
        try:
            if layout.startswith("packed"):
                out, lse = kernel.fwd(qp, kp, vp, *args, cache=call.cache)
                grads = kernel.bwd(dop, qp, kp, vp, out, lse, *args, cache=call.cache, **extra)
                outside: list[torch.Tensor | None] = [None, None, None]
            else:
                if not (call.in_place and hasattr(kernel, "fwd_in_place")):
                    continue
                fwd = kernel.fwd_in_place(q, k, v, call, scale)
                if fwd is None:
                    res.skipped = "in place declined, packed call used"
                    results.append(res)
                    continue
                out_full, lse_full = fwd
                out, lse = call.q_rows.take(out_full), call.q_rows.take(lse_full)
                full = kernel.bwd_in_place(dout, q, k, v, out_full, lse_full, call, scale,
                                           **extra)
                if full is None:
                    res.skipped = "in-place backward declined, packed call used"
                    results.append(res)
                    continue
                grads = (call.q_rows.take(full[0]), call.k_rows.take(full[1]),
                         call.k_rows.take(full[2]))
                outside = [_outside(full[0], call.q_rows), _outside(full[1], call.k_rows),
                           _outside(full[2], call.k_rows)]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            res.errors = {"out": _rel(out, ref_out), "lse": _lse_err(lse, ref_lse),
                          "dq": _rel(grads[0], ref_grads[0]), "dk": _rel(grads[1], ref_grads[1]),
                          "dv": _rel(grads[2], ref_grads[2])}
            res.zero_outside = all(o is None or bool((o == 0).all()) for o in outside)
            dq_dtype = grads[0].dtype
        except Exception as exc:  # reported as a failing row, with the reason
            res.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            dq_dtype = None
        used = Counter(FALLBACKS) - before
        res.fallback = "; ".join(sorted(used))
        if fp32_dq and dq_dtype not in (None, torch.float32) and not used:
            # The library declined a float32 dQ for this shape (the 16-bit graph served it:
            # slower, numbers checked all the same); any other reason is a bug.
            primary = getattr(kernel, "primary", kernel)
            declined = bool(getattr(primary, "dq_float_declined", ())) or not (
                primary.float_dq_honoured(device) if hasattr(primary, "float_dq_honoured")
                else True)
            if declined:
                res.fallback = "float32 dQ declined, 16-bit dQ"
            else:
                res.error = res.error or f"dQ came back {dq_dtype}, float32 asked"
        results.append(res)
    return results


def _outside(full: torch.Tensor, rows) -> torch.Tensor | None:
    """The rows of ``full`` that the call does not own (None when it owns them all)."""
    if rows.covers(full.shape[0]):
        return None
    keep = torch.ones(full.shape[0], dtype=torch.bool, device=full.device)
    if rows.index is None:
        keep[rows.start : rows.stop] = False
    else:
        keep[rows.index] = False
    return full[keep]


def versions() -> dict[str, str]:
    """Library, driver and device versions for the record."""
    info = {"torch": torch.__version__, "cuda (torch)": str(torch.version.cuda)}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuDNN (torch)"] = str(torch.backends.cudnn.version())
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, check=False)
            info["driver"] = smi.stdout.strip().splitlines()[0] if smi.stdout.strip() else "?"
        except OSError as exc:
            info["driver"] = f"unknown ({exc})"
    try:
        import cudnn

        info["cudnn-frontend"] = getattr(cudnn, "__version__", "?")
        info["cuDNN (frontend backend)"] = cudnn.backend_version_string()
    except Exception as exc:
        info["cudnn-frontend"] = f"not importable ({type(exc).__name__})"
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = "not importable"
    return info


def table(results: list[CaseResult]) -> list[str]:
    """Markdown rows: one per case x kernel x layout."""
    lines = ["| group | case | kernel | layout | out | lse | dq | dk | dv | result |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        errs = [f"{r.errors[n]:.1e}" if n in r.errors else "-"
                for n in ("out", "lse", "dq", "dk", "dv")]
        verdict = "n/a" if r.skipped else "PASS" if r.ok else "FAIL"
        notes = [x for x in (r.fallback and f"fallback: {r.fallback}", r.error, r.skipped,
                             "" if r.zero_outside else "rows outside the call not zero") if x]
        lines.append(f"| {r.group} | {r.case} | {r.kernel} | {r.layout} | {' | '.join(errs)} | "
                     f"{verdict}{' (' + '; '.join(notes) + ')' if notes else ''} |")
    return lines


def summary(results: list[CaseResult]) -> list[str]:
    """Markdown rows: one per group x kernel x layout (count, failures, worst error)."""
    groups: dict[tuple[str, str, str], list[CaseResult]] = {}
    for r in results:
        groups.setdefault((r.group, r.kernel, r.layout), []).append(r)
    lines = ["| group | kernel | layout | cases | pass | fail | fallbacks | max error |",
             "|---|---|---|---|---|---|---|---|"]
    for (group, kernel, layout), rs in groups.items():
        fails = sum(not r.ok for r in rs)
        fallbacks = sum(bool(r.fallback) for r in rs)
        worst = max((r.worst for r in rs if r.errors), default=float("nan"))
        lines.append(f"| {group} | {kernel} | {layout} | {len(rs)} | {len(rs) - fails} | "
                     f"{fails} | {fallbacks} | {worst:.1e} |")
    return lines


def engines_used() -> Counter[str]:
    """How many cached cuDNN graphs each engine serves (cuDNN library or a frontend engine)."""
    used: Counter[str] = Counter()
    for kernel in _kernels_in_cache():
        primary = getattr(kernel, "primary", None)
        for name in getattr(primary, "engines", {}).values():
            used[name] += 1
    return used


def _kernels_in_cache():
    from cp_attention.local_attention import _CACHE

    return list(_CACHE.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="flash,cudnn")
    parser.add_argument("--cp", default="2,4,8")
    parser.add_argument("--out", default=None, help="write the full table here (markdown)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("kernel_check needs a CUDA device", file=sys.stderr)
        sys.exit(2)
    device = torch.device("cuda")
    all_cases = cases(tuple(int(c) for c in args.cp.split(",")))
    results: list[CaseResult] = []
    start = time.perf_counter()
    for name in args.kernels.split(","):
        kernel = get_backend(device, name)
        for case in all_cases:
            results.extend(run_case(case, kernel, device, torch.bfloat16, layouts_for(kernel)))
    elapsed = time.perf_counter() - start
    for key, value in versions().items():
        print(f"{key}: {value}")
    print(f"cuDNN graphs by engine: {dict(engines_used())}")
    print(f"{len(all_cases)} cases, {len(results)} rows in {elapsed:.0f} s; fallbacks: "
          f"{dict(FALLBACKS) or 'none'}")
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(table(results)) + "\n")
    print("\n".join(summary(results)))
    failed = [r for r in results if not r.ok]
    for r in failed[:40]:
        print(f"FAIL {r.group} | {r.case} | {r.kernel} | {r.layout} | {r.errors} | {r.error}")
    print(f"RESULT: {'FAIL' if failed else 'PASS'} ({len(failed)} failing rows)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
