"""Combining partial attention results by their log-sum-exp (the ring "correction" step).

A CP step attends some query rows to one block of keys; the true output of a row is the
softmax-weighted mix of its partial outputs: ``lse = logaddexp(lse_a, lse_b)`` and
``out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)``. The correction arithmetic and
the LSE are float32 (float64 for float64 inputs); the running output is stored in the input
dtype, like each kernel's own output, so the common case (the first step covers every row)
costs no conversion copies: one bf16 rounding per merge, as in TE.

With ``fused=True`` (CUDA, Triton) the same arithmetic runs as one kernel per step
(:mod:`cp_attention.fused`) instead of ~10 eager ones, and a step result computed in place
(shaped like the running output, valid at the step's rows) is read without a gather.
"""

from __future__ import annotations

import math

import torch

from cp_attention.plan import Rows


def accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulator dtype for inputs of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class OutputMerger:
    """Running ``(out, lse)`` over the local query rows.

    Rows no step touched keep ``out = 0`` and ``lse = -inf``: those are padding rows, which is
    exactly what their output and gradient must be.
    """

    def __init__(self, q: torch.Tensor, fused: bool = False) -> None:
        self._q = q
        self._dtype = accum_dtype(q.dtype)
        self._fused = fused and q.is_cuda and self._dtype == torch.float32
        self.out: torch.Tensor | None = None
        self.lse: torch.Tensor | None = None

    def _init_empty(self) -> None:
        q = self._q
        self.out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        self.lse = torch.full(q.shape[:2], -math.inf, dtype=self._dtype, device=q.device)

    def add(self, rows: Rows, out: torch.Tensor, lse: torch.Tensor,
            in_place: bool = False) -> None:
        """Merge one step's partial output for ``rows``.

        :param in_place: ``out``/``lse`` have every local row (valid at ``rows``) instead of
            one row per selected row.
        """
        if self.out is None and rows.covers(self._q.shape[0]):
            # First step covering every row: adopt it, no merge arithmetic needed.
            self.out, self.lse = out, lse.to(self._dtype)
            return
        if self.out is None:
            self._init_empty()
        assert self.out is not None and self.lse is not None
        if self._fused:
            from cp_attention.fused import merge_rows_

            merge_rows_(self.out, self.lse, rows, out, lse.to(self._dtype), in_place)
            return
        if in_place:
            out, lse = rows.take(out), rows.take(lse)
        old_out, old_lse = rows.take(self.out), rows.take(self.lse)
        lse = lse.to(self._dtype)
        new_lse = torch.logaddexp(old_lse, lse)
        new_out = old_out * torch.exp(old_lse - new_lse).unsqueeze(-1)  # promotes to float32
        new_out += out * torch.exp(lse - new_lse).unsqueeze(-1)
        write_rows(self.out, rows, new_out)
        write_rows(self.lse, rows, new_lse)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out in the input dtype, lse [T, H] in the accumulator dtype)``."""
        if self.out is None:
            self._init_empty()
        assert self.out is not None and self.lse is not None
        return self.out.to(self._q.dtype), self.lse


def write_rows(dest: torch.Tensor, rows: Rows, value: torch.Tensor) -> None:
    """``dest[rows] = value``."""
    if rows.index is None:
        dest[rows.start : rows.stop] = value
    else:
        dest.index_copy_(0, rows.index, value.to(dest.dtype))


def add_rows(dest: torch.Tensor | None, rows: Rows, value: torch.Tensor, like: torch.Tensor,
             dtype: torch.dtype, in_place: bool = False) -> torch.Tensor:
    """``dest[rows] += value``, creating ``dest`` (shaped like ``like``) on first use.

    ``in_place``: ``value`` already has every row of ``like`` (zero outside ``rows``).
    """
    if in_place:
        if dest is None:
            return value.to(dtype)
        dest += value.to(dtype)
        return dest
    if dest is None:
        if rows.covers(like.shape[0]):
            return value.to(dtype)
        dest = torch.zeros(like.shape, dtype=dtype, device=like.device)
    if rows.index is None:
        dest[rows.start : rows.stop] += value.to(dtype)
    else:
        dest.index_add_(0, rows.index, value.to(dtype))
    return dest


def add_block_rows(dest: torch.Tensor, src: torch.Tensor, rows: Rows | None,
                   fused: bool = False) -> None:
    """``dest[rows] += src[rows]``: a peer's gradient for our KV block, valid at ``rows``.

    ``rows`` are the rows of our block the peer's step read; ``src`` may hold anything
    elsewhere (the peer did not zero them), and None means the peer read none of them.
    """
    if rows is None:
        return
    if rows.covers(dest.shape[0]):
        dest += src
    elif rows.index is None:
        dest[rows.start : rows.stop] += src[rows.start : rows.stop]
    elif fused and dest.is_cuda:
        from cp_attention.fused import add_rows_

        add_rows_(dest, src, rows)
    else:
        dest.index_add_(0, rows.index, src.index_select(0, rows.index))


def sum_parts(parts: list[tuple[torch.Tensor, Rows | None, dict | None]], like: torch.Tensor,
              fused: bool = False) -> torch.Tensor:
    """Sum of partial gradients shaped like ``like``, each valid at its rows, in the
    accumulator dtype, rounded once to ``like``'s dtype; rows no part covers are zero.

    A part is ``(tensor, rows, cache)``: ``tensor`` shaped like ``like`` (any float dtype),
    ``rows`` None when every row is valid, else the valid rows (the others are never read);
    ``cache`` (a planned call's cache, or None) keeps the device row mask of an index
    selection. One Triton kernel for up to four parts when ``fused`` (CUDA, float32
    accumulation), else eager ops with the same arithmetic.
    """
    acc = accum_dtype(like.dtype)
    if not parts:
        return torch.zeros_like(like)
    if fused and like.is_cuda and acc == torch.float32:
        from cp_attention.fused import sum_parts_

        out = torch.empty_like(like)
        if out.shape[0]:
            sum_parts_(out, [(t.contiguous(), _row_spec(rows, cache, like))
                             for t, rows, cache in parts])
        return out
    total = torch.zeros(like.shape, dtype=acc, device=like.device)
    for tensor, rows, _ in parts:
        if rows is None:
            total += tensor
        elif rows.index is None:
            total[rows.start : rows.stop] += tensor[rows.start : rows.stop]
        else:
            total.index_add_(0, rows.index, tensor.index_select(0, rows.index).to(acc))
    return total.to(like.dtype)


def _row_spec(rows: Rows | None, cache: dict | None, like: torch.Tensor) -> tuple:
    """The fused kernel's form of a row selection (an index becomes a cached int8 mask)."""
    if rows is None or rows.covers(like.shape[0]):
        return ("all",)
    if rows.index is None:
        return ("range", rows.start, rows.stop)
    key = ("row_mask", like.shape[0])
    mask = cache.get(key) if cache is not None else None
    if mask is None:
        mask = torch.zeros(like.shape[0], dtype=torch.int8, device=like.device)
        mask.index_fill_(0, rows.index, 1)
        if cache is not None:
            cache[key] = mask
    return ("mask", mask)


def gather_rows(out: torch.Tensor, out_index: torch.Tensor | None, src: torch.Tensor,
                src_index: torch.Tensor, other: torch.Tensor | None = None,
                fused: bool = False) -> None:
    """``out[out_index] = src[src_index] (+ other[out_index])``; ``src_index < 0``: zero rows.

    ``out_index`` None means the first ``len(src_index)`` rows of ``out``. One Triton kernel
    when ``fused`` (CUDA), else eager ops with the same rounding (no device-to-host sync).
    """
    if fused and out.is_cuda:
        from cp_attention.fused import gather_rows_

        gather_rows_(out, out_index, src, src_index, other)
        return
    valid = (src_index >= 0).view(-1, *([1] * (src.dim() - 1)))
    value = torch.where(valid, src.index_select(0, src_index.clamp(min=0)), 0)
    if out_index is None:
        target = out[: src_index.numel()]
        if other is not None:
            value = value + other[: src_index.numel()]
        target.copy_(value)
        return
    if other is not None:
        value = value + other.index_select(0, out_index)
    out.index_copy_(0, out_index, value.to(out.dtype))


def gather_sum(out: torch.Tensor, sources: list[tuple[torch.Tensor, torch.Tensor]],
               fused: bool = False) -> None:
    """``out[i] = sum of src[index[i]]`` over ``(src, index)`` sources, a negative index
    adding nothing; summed in the accumulator dtype and rounded once to ``out``'s dtype, so
    rows no source reads are zero. One Triton kernel for up to two sources when ``fused``
    (CUDA), else eager ops with the same arithmetic."""
    if fused and out.is_cuda and accum_dtype(out.dtype) == torch.float32 \
            and 1 <= len(sources) <= 2:
        from cp_attention.fused import gather_sum_

        gather_sum_(out, [(s.contiguous(), i) for s, i in sources])
        return
    total = torch.zeros(out.shape, dtype=accum_dtype(out.dtype), device=out.device)
    for src, index in sources:
        valid = (index >= 0).view(-1, *([1] * (src.dim() - 1)))
        total += torch.where(valid, src.index_select(0, index.clamp(min=0)), 0)
    out.copy_(total)
