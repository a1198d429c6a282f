"""One-kernel log-sum-exp merge of a CP step's partial output (CUDA, Triton).

The eager merge in :mod:`cp_attention.merge` is ~10 elementwise kernels per step (gather the
old rows, ``logaddexp``, two ``exp``, two products in float32, the cast, two scatters), each a
full pass over ``[rows, heads, dim]``. This kernel does the same arithmetic in one pass: for
each selected row it reads the running ``(out, lse)`` and the step's ``(out, lse)``, and writes
the merged pair in place. Arithmetic as in the eager path: LSE and weights in float32,
``logaddexp`` with ``-inf`` handled the same way, the output rounded once to its dtype.

The step's result may be packed (one row per selected row) or in place (shaped like the running
output, valid at the selected rows: what the in-place cuDNN call returns). Used on CUDA when
Triton imports; :func:`available` says so, and the eager path is used otherwise.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def available() -> bool:
    """Whether Triton imports (it ships with CUDA builds of torch)."""
    try:
        import triton
        import triton.language  # noqa: F401
    except Exception:
        return False
    return True


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def merge_rows(out_ptr, lse_ptr, step_out_ptr, step_lse_ptr, rows_ptr, first_row,
                   s_out_t, s_out_h, s_lse_t, s_lse_h, s_step_t, s_step_h, s_slse_t, s_slse_h,
                   HEADS: tl.constexpr, DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_D: tl.constexpr, HAS_INDEX: tl.constexpr,
                   STEP_IN_PLACE: tl.constexpr):
        i = tl.program_id(0)
        if HAS_INDEX:
            row = tl.load(rows_ptr + i)
        else:
            row = first_row + i
        step_row = row if STEP_IN_PLACE else i
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        h_ok = h < HEADS
        a = tl.load(lse_ptr + row * s_lse_t + h * s_lse_h, mask=h_ok, other=0.0)
        b = tl.load(step_lse_ptr + step_row * s_slse_t + h * s_slse_h, mask=h_ok, other=0.0)
        m = tl.maximum(a, b)
        both_inf = (a == b) & (tl.abs(a) == float("inf"))
        new = tl.where(both_inf, a, m + tl.log(1.0 + tl.exp(-tl.abs(a - b))))
        w_old = tl.exp(a - new)
        w_new = tl.exp(b - new)
        mask = h_ok[:, None] & (d[None, :] < DIM)
        o_off = row * s_out_t + h[:, None] * s_out_h + d[None, :]
        s_off = step_row * s_step_t + h[:, None] * s_step_h + d[None, :]
        old = tl.load(out_ptr + o_off, mask=mask, other=0.0).to(tl.float32)
        step = tl.load(step_out_ptr + s_off, mask=mask, other=0.0).to(tl.float32)
        merged = old * w_old[:, None] + step * w_new[:, None]
        tl.store(out_ptr + o_off, merged.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(lse_ptr + row * s_lse_t + h * s_lse_h, new, mask=h_ok)

    return merge_rows


def merge_rows_(out: torch.Tensor, lse: torch.Tensor, rows, step_out: torch.Tensor,
                step_lse: torch.Tensor, step_in_place: bool) -> None:
    """Merge ``(step_out, step_lse)`` into ``(out, lse)`` at ``rows`` (a ``Rows``), in place.

    ``out``/``step_out`` are ``[T, H, D]`` with unit stride over ``D``; ``lse``/``step_lse``
    ``[T, H]`` float32, any strides.
    """
    import triton

    if out.stride(2) != 1 or step_out.stride(2) != 1:
        raise ValueError("merge_rows_ needs unit stride over the head dimension")
    heads, dim = out.shape[1], out.shape[2]
    # Without an index the pointer is never read; any valid device pointer will do.
    index = rows.index if rows.index is not None else lse
    _kernel()[(rows.count,)](
        out, lse, step_out, step_lse, index, rows.start,
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        step_out.stride(0), step_out.stride(1), step_lse.stride(0), step_lse.stride(1),
        HEADS=heads, DIM=dim, BLOCK_H=triton.next_power_of_2(heads),
        BLOCK_D=triton.next_power_of_2(dim), HAS_INDEX=rows.index is not None,
        STEP_IN_PLACE=step_in_place, num_warps=4,
    )


@functools.cache
def _add_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def add_rows(dest_ptr, src_ptr, rows_ptr, first_row, s_dest_t, s_src_t,
                 WIDTH: tl.constexpr, BLOCK: tl.constexpr, HAS_INDEX: tl.constexpr):
        i = tl.program_id(0)
        if HAS_INDEX:
            row = tl.load(rows_ptr + i)
        else:
            row = first_row + i
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = col < WIDTH
        a = tl.load(dest_ptr + row * s_dest_t + col, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(src_ptr + row * s_src_t + col, mask=mask, other=0.0).to(tl.float32)
        tl.store(dest_ptr + row * s_dest_t + col, (a + b).to(dest_ptr.dtype.element_ty),
                 mask=mask)

    return add_rows


def add_rows_(dest: torch.Tensor, src: torch.Tensor, rows) -> None:
    """``dest[rows] += src[rows]`` for two ``[T, ...]`` tensors of one dtype, one kernel.

    The sum is rounded once to the dtype, as ``torch.add`` does; rows outside ``rows`` are
    neither read nor written (``src`` may hold anything there).
    """
    import triton

    width = dest[0].numel()
    if not (dest.is_contiguous() and src.is_contiguous()) or dest.dtype != src.dtype:
        raise ValueError("add_rows_ needs two contiguous tensors of one dtype")
    index = rows.index if rows.index is not None else dest
    block = min(4096, triton.next_power_of_2(width))
    grid = (rows.count, triton.cdiv(width, block))
    _add_kernel()[grid](dest, src, index, rows.start, dest.stride(0), src.stride(0), WIDTH=width,
                        BLOCK=block, HAS_INDEX=rows.index is not None, num_warps=4)


@functools.cache
def _gather_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gather_rows(out_ptr, out_idx_ptr, src_ptr, src_idx_ptr, other_ptr, s_out_t, s_src_t,
                    s_other_t, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
                    HAS_OUT_IDX: tl.constexpr, HAS_OTHER: tl.constexpr):
        i = tl.program_id(0).to(tl.int64)
        if HAS_OUT_IDX:
            row = tl.load(out_idx_ptr + i)
        else:
            row = i
        src_row = tl.load(src_idx_ptr + i)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = col < WIDTH
        val = tl.load(src_ptr + src_row * s_src_t + col, mask=mask & (src_row >= 0),
                      other=0.0).to(tl.float32)
        if HAS_OTHER:
            val += tl.load(other_ptr + row * s_other_t + col, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * s_out_t + col, val.to(out_ptr.dtype.element_ty), mask=mask)

    return gather_rows


def gather_rows_(out: torch.Tensor, out_index: torch.Tensor | None, src: torch.Tensor,
                 src_index: torch.Tensor, other: torch.Tensor | None = None) -> None:
    """``out[out_index[i]] = src[src_index[i]] (+ other[out_index[i]])``, one kernel.

    ``out_index`` None means rows ``0 .. len(src_index)``; a negative ``src_index`` reads as a
    zero row. The optional sum is rounded once to the dtype, as ``torch.add`` does.
    """
    import triton

    tensors = [t for t in (out, src, other) if t is not None]
    if not all(t.is_contiguous() and t.dtype == out.dtype for t in tensors):
        raise ValueError("gather_rows_ needs contiguous tensors of one dtype")
    width = out[0].numel()
    count = src_index.numel()
    if count == 0:
        return
    block = min(4096, triton.next_power_of_2(width))
    grid = (count, triton.cdiv(width, block))
    _gather_kernel()[grid](
        out, out_index if out_index is not None else src_index, src, src_index,
        other if other is not None else out, out.stride(0), src.stride(0),
        other.stride(0) if other is not None else 0, WIDTH=width, BLOCK=block,
        HAS_OUT_IDX=out_index is not None, HAS_OTHER=other is not None, num_warps=4,
    )


#: Sources one :func:`sum_parts_` launch reads; more are pre-summed in float32.
SUM_SOURCES = 4


@functools.cache
def _sum_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _term(acc, ptr, stride, lo, hi, mask_ptr, row, col, ok, KIND: tl.constexpr):
        # KIND 0: no source; 1: every row; 2: rows [lo, hi); 3: rows where mask_ptr[row] != 0.
        if KIND == 1:
            acc += tl.load(ptr + row * stride + col, mask=ok, other=0.0).to(tl.float32)
        elif KIND == 2:
            use = (row >= lo) & (row < hi)
            acc += tl.load(ptr + row * stride + col, mask=ok & use, other=0.0).to(tl.float32)
        elif KIND == 3:
            use = tl.load(mask_ptr + row) != 0
            acc += tl.load(ptr + row * stride + col, mask=ok & use, other=0.0).to(tl.float32)
        return acc

    @triton.jit
    def sum_parts(out_ptr, s_out,
                  p0, s0, lo0, hi0, m0, p1, s1, lo1, hi1, m1,
                  p2, s2, lo2, hi2, m2, p3, s3, lo3, hi3, m3,
                  WIDTH: tl.constexpr, BLOCK: tl.constexpr, K0: tl.constexpr,
                  K1: tl.constexpr, K2: tl.constexpr, K3: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = col < WIDTH
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        acc = _term(acc, p0, s0, lo0, hi0, m0, row, col, ok, K0)
        acc = _term(acc, p1, s1, lo1, hi1, m1, row, col, ok, K1)
        acc = _term(acc, p2, s2, lo2, hi2, m2, row, col, ok, K2)
        acc = _term(acc, p3, s3, lo3, hi3, m3, row, col, ok, K3)
        tl.store(out_ptr + row * s_out + col, acc.to(out_ptr.dtype.element_ty), mask=ok)

    return sum_parts


def sum_parts_(out: torch.Tensor, parts: list[tuple[torch.Tensor, tuple]]) -> None:
    """``out = sum of parts`` in float32, rounded once to ``out``'s dtype; one pass per
    :data:`SUM_SOURCES` parts.

    Each part is ``(tensor, rows)`` with ``tensor`` shaped like ``out`` (any float dtype,
    contiguous) and ``rows`` one of ``("all",)``, ``("range", lo, hi)`` or ``("mask", m)``
    (``m`` an int8 ``[T]`` tensor, nonzero where the part is valid); a part's rows outside its
    selection are never read. Rows no part selects come out zero.
    """
    import triton

    if not out.is_contiguous() or any(not t.is_contiguous() or t.shape != out.shape
                                      for t, _ in parts):
        raise ValueError("sum_parts_ needs contiguous parts shaped like the output")
    if len(parts) > SUM_SOURCES:
        head = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        sum_parts_(head, parts[:SUM_SOURCES])
        parts = [(head, ("all",)), *parts[SUM_SOURCES:]]
    width = out[0].numel()
    block = min(4096, triton.next_power_of_2(width))
    args: list = []
    kinds: list[int] = []
    for i in range(SUM_SOURCES):
        if i >= len(parts):
            args += [out, 0, 0, 0, out]
            kinds.append(0)
            continue
        tensor, rows = parts[i]
        kind = {"all": 1, "range": 2, "mask": 3}[rows[0]]
        lo, hi = (rows[1], rows[2]) if kind == 2 else (0, 0)
        args += [tensor, tensor.stride(0), lo, hi, rows[1] if kind == 3 else out]
        kinds.append(kind)
    grid = (out.shape[0], triton.cdiv(width, block))
    _sum_kernel()[grid](out, out.stride(0), *args, WIDTH=width, BLOCK=block, K0=kinds[0],
                        K1=kinds[1], K2=kinds[2], K3=kinds[3], num_warps=4)


@functools.cache
def _gather_sum_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gather_sum(out_ptr, s_out_t, a_ptr, a_idx_ptr, s_a_t, b_ptr, b_idx_ptr, s_b_t,
                   WIDTH: tl.constexpr, BLOCK: tl.constexpr, HAS_B: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = col < WIDTH
        a_row = tl.load(a_idx_ptr + row)
        val = tl.load(a_ptr + a_row * s_a_t + col, mask=mask & (a_row >= 0),
                      other=0.0).to(tl.float32)
        if HAS_B:
            b_row = tl.load(b_idx_ptr + row)
            val += tl.load(b_ptr + b_row * s_b_t + col, mask=mask & (b_row >= 0),
                           other=0.0).to(tl.float32)
        tl.store(out_ptr + row * s_out_t + col, val.to(out_ptr.dtype.element_ty), mask=mask)

    return gather_sum


def gather_sum_(out: torch.Tensor, sources: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """``out[i] = sum over sources of src[index[i]]`` (a negative index adds nothing), one
    kernel for one or two sources, summed in float32 and rounded once to ``out``'s dtype.

    Every row of ``out`` is written (rows no source reads come out zero); each ``index`` has
    one int64 entry per row of ``out``.
    """
    import triton

    if not 1 <= len(sources) <= 2:
        raise ValueError(f"gather_sum_ takes one or two sources, got {len(sources)}")
    if not out.is_contiguous() or any(not s.is_contiguous() or s.dtype != out.dtype
                                      or i.numel() != out.shape[0] for s, i in sources):
        raise ValueError("gather_sum_ needs contiguous sources of out's dtype and one index "
                         "entry per output row")
    if out.shape[0] == 0:
        return
    width = out[0].numel()
    block = min(4096, triton.next_power_of_2(width))
    (a, a_idx), (b, b_idx) = sources[0], sources[-1]
    grid = (out.shape[0], triton.cdiv(width, block))
    _gather_sum_kernel()[grid](out, out.stride(0), a, a_idx, a.stride(0), b, b_idx, b.stride(0),
                               WIDTH=width, BLOCK=block, HAS_B=len(sources) == 2, num_warps=4)
