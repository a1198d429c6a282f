"""The local (single-device) variable-length attention kernel behind one small interface.

CP attention calls the local kernel once per CP step and merges the partial results by their
log-sum-exp, so every backend must return the LSE. Interface (THD tensors ``[tokens, heads,
dim]``, ``cu`` int32 offsets on the tensors' device, max lengths as Python ints so nothing is
read back from the device):

* ``fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, square) -> (out, lse)`` with ``lse``
  shaped ``[tokens_q, heads]``;
* ``bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, square)
  -> (dq, dk, dv)``, where ``out``/``lse`` are the *final* merged values (ring backward).

``causal`` masks are bottom-right aligned (query ``i`` of a segment sees key ``j`` iff
``j <= i + len_k - len_q``); ``square`` says every segment has ``len_q == len_k``, where
top-left and bottom-right coincide. Backends: ``math`` (exact reference, CPU or any device),
``flash`` (torch's ``aten::_flash_attention_forward/backward``), ``cudnn`` (cuDNN SDPA through
``nvidia-cudnn-frontend``'s torch ops, ragged THD with stats). GQA: key/value heads may divide
query heads.
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from typing import Protocol

import torch

_LOG = logging.getLogger("cp_attention.local_attention")

#: Kernel calls served by a fallback kernel, by ``"<kernel>-><fallback> <fwd|bwd>: <reason>"``.
#: Read with :func:`fallback_counts`; every new reason is also logged once (WARNING).
FALLBACKS: Counter[str] = Counter()

BACKENDS = ("auto", "math", "flash", "cudnn", "cudnn_autotune", "cudnn_op")
ENV_BACKEND = "CPTRACE_CP_KERNEL"


class LocalAttention(Protocol):
    """A variable-length attention kernel that returns its log-sum-exp."""

    name: str

    def fwd(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
        cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool, scale: float, square: bool,
        cache: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def bwd(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
        max_q: int, max_k: int, causal: bool, scale: float, square: bool,
        cache: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def _segment_positions(cu: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Segment id and distance from the segment's end (``pos - len``) for each row."""
    cu = cu.long()
    lengths = cu[1:] - cu[:-1]
    ids = torch.arange(lengths.numel(), device=cu.device)
    seg = torch.repeat_interleave(ids, lengths, output_size=total)
    pos = torch.arange(total, device=cu.device) - cu[seg]
    return seg, pos - lengths[seg]


class MathAttention:
    """Exact attention with an explicit mask, computed in float64; the reference and CPU path.

    Memory is ``heads x tokens_q x tokens_k``: meant for tests and small CPU runs.
    """

    name = "math"

    def _probs(
        self, q: torch.Tensor, k: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
        causal: bool, scale: float, lse: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked probabilities ``[H, Tq, Tk]`` and the LSE ``[Tq, H]`` (given or computed)."""
        seg_q, end_q = _segment_positions(cu_q, q.shape[0])
        seg_k, end_k = _segment_positions(cu_k, k.shape[0])
        allowed = seg_q[:, None] == seg_k[None, :]
        if causal:
            allowed &= end_k[None, :] <= end_q[:, None]
        scores = torch.einsum("qhd,khd->hqk", q.double(), _expand(k, q).double()) * scale
        scores = scores.masked_fill(~allowed, -math.inf)
        if lse is None:
            lse = torch.logsumexp(scores, dim=-1).transpose(0, 1)
        lse_hq = lse.double().transpose(0, 1)[..., None]
        # Rows without keys have lse=-inf; their probabilities are 0, not NaN.
        probs = torch.where(allowed, torch.exp(scores - lse_hq.nan_to_num(neginf=0.0)), 0.0)
        return probs, lse

    def fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, square, cache=None):
        probs, lse = self._probs(q, k, cu_q, cu_k, causal, scale, None)
        out = torch.einsum("hqk,khd->qhd", probs, _expand(v, q).double())
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        return out.to(q.dtype), lse.to(acc)

    def bwd(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, square,
            cache=None):
        probs, _ = self._probs(q, k, cu_q, cu_k, causal, scale, lse)
        do, o = dout.double(), out.double()
        dp = torch.einsum("qhd,khd->hqk", do, _expand(v, q).double())
        delta = (do * o).sum(-1).transpose(0, 1)[..., None]
        ds = probs * (dp - delta)
        dq = torch.einsum("hqk,khd->qhd", ds, _expand(k, q).double()) * scale
        dk = _reduce_groups(torch.einsum("hqk,qhd->khd", ds, q.double()) * scale, k)
        dv = _reduce_groups(torch.einsum("hqk,qhd->khd", probs, do), v)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _expand(kv: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Repeat KV heads for grouped-query attention."""
    group = q.shape[1] // kv.shape[1]
    return kv if group == 1 else kv.repeat_interleave(group, dim=1)


def _reduce_groups(grad: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """Sum the per-query-head gradients of a shared KV head."""
    group = grad.shape[1] // kv.shape[1]
    if group == 1:
        return grad
    return grad.view(grad.shape[0], kv.shape[1], group, grad.shape[2]).sum(2)


class FlashAttention:
    """torch's built-in FlashAttention-2 varlen kernels (``aten::_flash_attention_*``)."""

    name = "flash"

    def __init__(self) -> None:
        self._rng: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, square, cache=None):
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=scale
        )
        return out, self._packed_lse(lse, cu_q, q.shape[0])

    def bwd(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, square,
            cache=None):
        seed, offset = self._philox(q.device)
        kernel_lse = lse.transpose(0, 1).contiguous()
        if self._padded_lse.get(q.device, False):
            kernel_lse = _packed_to_padded(kernel_lse, cu_q, max_q)
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout, q, k, v, out, kernel_lse, cu_q, cu_k, max_q, max_k, 0.0, causal, seed, offset,
            scale=scale,
        )
        return dq, dk, dv

    _padded_lse: dict[torch.device, bool] = {}  # noqa: RUF012 - per-device layout probe result

    def _packed_lse(self, lse: torch.Tensor, cu_q: torch.Tensor, total: int) -> torch.Tensor:
        """``[Tq, H]`` from the kernel's ``[H, Tq]`` (or older padded ``[B, H, max_q]``)."""
        if lse.dim() == 2:
            self._padded_lse[lse.device] = False
            return lse.transpose(0, 1)
        self._padded_lse[lse.device] = True
        seg, end = _segment_positions(cu_q, total)
        pos = end + (cu_q[1:] - cu_q[:-1]).long()[seg]
        return lse[seg, :, pos]

    def _philox(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """RNG state tensors the backward signature wants (unused without dropout)."""
        if device not in self._rng:
            x = torch.zeros(8, 1, 64, device=device, dtype=torch.bfloat16)
            cu = torch.tensor([0, 8], device=device, dtype=torch.int32)
            _, _, seed, offset, _ = torch.ops.aten._flash_attention_forward(
                x, x, x, cu, cu, 8, 8, 0.0, False, False
            )
            self._rng[device] = (seed, offset)
        return self._rng[device]


def _packed_to_padded(lse_hq: torch.Tensor, cu_q: torch.Tensor, max_q: int) -> torch.Tensor:
    """``[H, Tq]`` packed LSE to ``[B, H, max_q]`` (device-side, no sync)."""
    total = lse_hq.shape[1]
    seg, end = _segment_positions(cu_q, total)
    pos = end + (cu_q[1:] - cu_q[:-1]).long()[seg]
    padded = lse_hq.new_zeros((cu_q.numel() - 1, lse_hq.shape[0], max_q))
    padded[seg, :, pos] = lse_hq.transpose(0, 1)
    return padded


class CudnnOpAttention:
    """cuDNN SDPA through ``nvidia-cudnn-frontend``'s own torch ops (``cudnn_op``).

    Kept for comparison: the ops rebuild ragged metadata on every call, which makes them
    host-bound inside a CP ring; the ``cudnn`` backend (:mod:`cp_attention.cudnn_graph`)
    drives the same kernels from cached metadata.

    Importing ``cudnn.sdpa.fwd.torch_op`` registers ``torch.ops.cudnn.sdpa_fwd/sdpa_bwd``;
    the frontend caches one execution plan per shape.
    """

    name = "cudnn_op"

    def __init__(self) -> None:
        from cudnn.sdpa.fwd import torch_op

        self._to_padded = torch_op.thd_lse_to_padded

    def fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, square, cache=None):
        out, stats = torch.ops.cudnn.sdpa_fwd(
            q, k, v, scale, is_causal=causal, causal_bottom_right=causal and not square,
            cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k, max_seqlen_q=max_q, max_seqlen_kv=max_k,
            return_lse=True,
        )
        return out, stats.view(q.shape[0], q.shape[1])

    def bwd(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, square,
            cache=None):
        padded = self._to_padded(lse.contiguous(), cu_q, max_q)
        return torch.ops.cudnn.sdpa_bwd(
            dout, q, k, v, out, padded, scale, is_causal=causal,
            causal_bottom_right=causal and not square, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k,
            max_seqlen_q=max_q, max_seqlen_kv=max_k,
        )


class GuardedAttention:
    """A fast kernel with a correct fallback for the shapes it must not serve.

    A shape goes to ``fallback`` when the primary declines to build it (cuDNN's
    ``GraphUnsupported``) or when ``known_bad(kind, q, k, causal, square)`` names a reason
    (shapes found wrong by the single-GPU kernel checks). Each fallback call is counted in
    :data:`FALLBACKS` and each new reason logged once, so a slower path is never silent.
    The primary's in-place methods (``fwd_in_place``/``bwd_in_place``) pass through; they
    return None for such shapes, and the caller then uses the packed calls, which fall back.
    """

    def __init__(self, primary, fallback, known_bad=None) -> None:
        self.primary, self.fallback = primary, fallback
        self.name = primary.name
        #: Whether ``bwd``/``bwd_in_place`` take ``dq_dtype`` (the primary's; a fallback
        #: call ignores it and returns dQ in the input dtype).
        self.accepts_dq_dtype = bool(getattr(primary, "accepts_dq_dtype", False))
        self._known_bad = known_bad
        self._bad: dict[tuple, str] = {}

    @staticmethod
    def _signature(kind: str, q, k, b: int, max_q: int, max_k: int, causal: bool,
                   square: bool) -> tuple:
        return (kind, q.dtype, q.shape[1:], k.shape[1:], b, max_q, max_k, causal, square)

    def _reason(self, sig: tuple, q, k, causal: bool, square: bool) -> str | None:
        if sig not in self._bad and self._known_bad is not None:
            reason = self._known_bad(sig[0], q, k, causal, square)
            if reason is not None:
                self._bad[sig] = reason
        return self._bad.get(sig)

    def _fall_back(self, sig: tuple, reason: str) -> None:
        label = f"{self.primary.name}->{self.fallback.name} {sig[0]}: {reason}"
        if label not in FALLBACKS:
            _LOG.warning("cp_attention: %s kernel not used for q%s k%s b=%d max_q=%d max_k=%d "
                         "causal=%s (%s); using %s for this shape", self.primary.name,
                         tuple(sig[2]), tuple(sig[3]), sig[4], sig[5], sig[6], sig[7], reason,
                         self.fallback.name)
        FALLBACKS[label] += 1

    def fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, square, cache=None):
        sig = self._signature("fwd", q, k, cu_q.numel() - 1, max_q, max_k, causal, square)
        reason = self._reason(sig, q, k, causal, square)
        if reason is None:
            from cp_attention.cudnn_graph import GraphUnsupported

            try:
                return self.primary.fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, square,
                                        cache)
            except GraphUnsupported as exc:
                reason = self._bad[sig] = f"graph unsupported ({exc})"
        self._fall_back(sig, reason)
        return self.fallback.fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, square, cache)

    def bwd(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, square,
            cache=None, dq_dtype=None):
        sig = self._signature("bwd", q, k, cu_q.numel() - 1, max_q, max_k, causal, square)
        reason = self._reason(sig, q, k, causal, square)
        if reason is None:
            from cp_attention.cudnn_graph import GraphUnsupported

            extra = {"dq_dtype": dq_dtype} if dq_dtype is not None else {}
            try:
                return self.primary.bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k,
                                        causal, scale, square, cache, **extra)
            except GraphUnsupported as exc:
                reason = self._bad[sig] = f"graph unsupported ({exc})"
        self._fall_back(sig, reason)
        return self.fallback.bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal,
                                 scale, square, cache)

    def _in_place(self, kind: str, q, k, call, run):
        from cp_attention.cudnn_graph import GraphUnsupported

        sig = self._signature(kind, q, k, call.cu_q.numel() - 1, call.max_q, call.max_k,
                              call.causal, call.square)
        if self._reason(sig, q, k, call.causal, call.square) is not None:
            return None
        try:
            return run()
        except GraphUnsupported:
            return None  # the packed call that follows records and counts the fallback

    def fwd_in_place(self, q, k, v, call, scale):
        return self._in_place("fwd", q, k, call,
                              lambda: self.primary.fwd_in_place(q, k, v, call, scale))

    def bwd_in_place(self, dout, q, k, v, out, lse, call, scale, zero_k_outside=True,
                     zero_q_outside=True, dq_dtype=None):
        extra = {"dq_dtype": dq_dtype} if dq_dtype is not None else {}
        return self._in_place("bwd", q, k, call, lambda: self.primary.bwd_in_place(
            dout, q, k, v, out, lse, call, scale, zero_k_outside, zero_q_outside, **extra))


def fallback_counts() -> dict[str, int]:
    """Calls served by a fallback kernel so far, by reason (empty when none)."""
    return dict(FALLBACKS)


_CACHE: dict[tuple[str, str], LocalAttention] = {}


def release_cached_kernels() -> None:
    """Drop the cached kernel objects and the cuDNN graphs and handles they hold (captured
    CUDA graphs first: they launch those kernels)."""
    from cp_attention.graphs import release_all

    release_all()
    kernels = list(_CACHE.values())
    _CACHE.clear()
    for kernel in kernels:
        primary = getattr(kernel, "primary", kernel)
        release = getattr(primary, "release", None)
        if release is not None:
            release()


def cudnn_available() -> bool:
    """Whether ``nvidia-cudnn-frontend`` (with its cuDNN library) imports on this host."""
    try:
        import cudnn

        return hasattr(cudnn, "pygraph")
    except Exception:
        return False


def get_backend(device: torch.device, name: str | None = None) -> LocalAttention:
    """The kernel for ``device``: ``name``, else ``$CPTRACE_CP_KERNEL``, else automatic.

    Automatic: ``math`` on CPU; on CUDA ``cudnn`` when the frontend imports and the GPU is
    Hopper or newer (cuDNN's fused kernels measured faster there), else ``flash``.

    :raises ValueError: for an unknown backend name or a GPU kernel asked for on CPU.
    """
    choice = name or os.environ.get(ENV_BACKEND, "auto")
    if choice not in BACKENDS:
        raise ValueError(f"local attention backend must be one of {BACKENDS}, got {choice!r}")
    if choice == "auto":
        if device.type != "cuda":
            choice = "math"
        elif torch.cuda.get_device_capability(device)[0] >= 9 and cudnn_available():
            choice = "cudnn"
        else:
            choice = "flash"
    if choice != "math" and device.type != "cuda":
        raise ValueError(f"backend {choice!r} needs a CUDA device, got {device}")
    key = (choice, str(device))
    if key not in _CACHE:
        _CACHE[key] = _construct(choice)
    return _CACHE[key]


def _construct(choice: str) -> LocalAttention:
    if choice in ("cudnn", "cudnn_autotune"):
        from cp_attention.cudnn_graph import CudnnGraphAttention, known_bad

        primary = CudnnGraphAttention(autotune=choice == "cudnn_autotune")
        return GuardedAttention(primary, FlashAttention(), known_bad)
    plain: dict[str, type[LocalAttention]] = {
        "math": MathAttention, "flash": FlashAttention, "cudnn_op": CudnnOpAttention,
    }
    return plain[choice]()


def varlen_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
    max_q: int, max_k: int, causal: bool, softmax_scale: float | None = None,
    square: bool = True, backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One variable-length attention forward; returns ``(out, lse[Tq, H])``."""
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    kernel = get_backend(q.device, backend)
    return kernel.fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, square)


def varlen_bwd(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int,
    causal: bool, softmax_scale: float | None = None, square: bool = True,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`varlen_fwd` given the (final, merged) ``out`` and ``lse``."""
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    kernel = get_backend(q.device, backend)
    return kernel.bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, square)
