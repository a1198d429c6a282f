"""Token partitioning of a packed (THD) batch across context-parallel ranks.

Two strategies (DESIGN problem 2):

* ``dual_chunk_swap``: every sequence is cut into ``2*cp`` equal chunks and rank ``r`` owns
  chunks ``r`` and ``2*cp-1-r``, which balances causal work. Each padded sequence length must be
  divisible by ``2*cp`` (:func:`pad_sequences_to_multiple` makes it so).
* ``no_load_balance``: rank ``r`` owns the ``r``-th contiguous ``1/cp`` of the packed buffer.

Everything here is host-side numpy over sequence arrays (no Python loop per sequence); the
resulting index tensors are built once per batch by :class:`cp_attention.PackedBatch` and the
hot path only runs one ``index_select``/``narrow`` per tensor. Token alignment for FP8/FSDP
(DESIGN problem 3) is :func:`pad_to_multiple`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

STRATEGIES = ("dual_chunk_swap", "no_load_balance")
ALIGNMENTS = (8, 16, 128)


def as_offsets(values: Sequence[int] | torch.Tensor | np.ndarray, name: str) -> np.ndarray:
    """Read cumulative offsets from a list or a CPU tensor into an int64 array, validated.

    :raises ValueError: when the offsets are not 1-D, do not start at 0, or decrease.
    """
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            # Reading a device tensor here would be a hidden device->host sync; the data loader
            # has these values on the host already.
            raise ValueError(
                f"{name} must be a list or a CPU tensor, got a tensor on {values.device}"
            )
        values = values.tolist()
    arr = np.asarray(values, dtype=np.int64)
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"{name} must be 1-D with at least 2 entries, got shape {arr.shape}")
    if arr[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {int(arr[0])}")
    steps = np.diff(arr)
    if (steps < 0).any():
        bad = int(np.flatnonzero(steps < 0)[0])
        raise ValueError(
            f"{name} must be non-decreasing; {name}[{bad + 1}]={int(arr[bad + 1])} < "
            f"{name}[{bad}]={int(arr[bad])}"
        )
    return arr


def pad_sequences_to_multiple(cu_seqlens: Sequence[int] | torch.Tensor, multiple: int) -> list[int]:
    """Padded offsets in which every sequence length is rounded up to ``multiple``.

    Use ``multiple=2*cp`` before DualChunkSwap. The result is the ``cu_seqlens_padded`` to
    pass with the unchanged ``cu_seqlens``; :func:`repack_padded` moves token data into it.
    """
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    cu = as_offsets(cu_seqlens, "cu_seqlens")
    lengths = np.diff(cu)
    padded = -(-lengths // multiple) * multiple
    return [0, *np.cumsum(padded).tolist()]


def pad_to_multiple(
    cu_seqlens_padded: Sequence[int] | torch.Tensor, multiple: int, *, cp_size: int = 1
) -> list[int]:
    """Grow the packed buffer so every CP rank's token count divides by ``multiple``.

    FP8 GEMMs need the token dimension divisible by 8 (16 for some layouts, 128 for blockwise
    scaling); one rank raising while the others wait in a collective looks like a hang (TE
    issue #1795). It is each rank's *local* token count (``total / cp``) that reaches the
    GEMMs, so the total is rounded to ``lcm(multiple * cp_size, 2 * cp_size)``, which also keeps
    DualChunkSwap's ``2*cp`` divisibility. The extra tokens become tail padding of the last
    sequence, described in ``cu_seqlens_padded``, and every strategy treats them as padding.

    :raises ValueError: for an alignment other than 8, 16 or 128.
    """
    if multiple not in ALIGNMENTS:
        raise ValueError(f"alignment must be one of {ALIGNMENTS}, got {multiple}")
    cu = as_offsets(cu_seqlens_padded, "cu_seqlens_padded")
    step = math.lcm(multiple * cp_size, 2 * cp_size)
    total = int(cu[-1])
    target = -(-total // step) * step
    out = cu.tolist()
    out[-1] = target
    return out


def repack_padded(
    x: torch.Tensor,
    cu_seqlens: Sequence[int] | torch.Tensor,
    cu_seqlens_padded: Sequence[int] | torch.Tensor,
    fill: float | int = 0,
) -> torch.Tensor:
    """Copy an unpadded packed tensor ``[T_real, ...]`` into the padded layout ``[T_padded, ...]``.

    Padding slots get ``fill`` (use ``-100``-style ignore values for labels).
    """
    cu = as_offsets(cu_seqlens, "cu_seqlens")
    cup = as_offsets(cu_seqlens_padded, "cu_seqlens_padded")
    if x.shape[0] != cu[-1]:
        raise ValueError(f"x has {x.shape[0]} tokens but cu_seqlens ends at {int(cu[-1])}")
    dest = ranges_to_index(cup[:-1], np.diff(cu))
    out = x.new_full((int(cup[-1]), *x.shape[1:]), fill)
    out[torch.from_numpy(dest).to(x.device)] = x
    return out


def ranges_to_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(start, start+length)`` for every range, vectorized."""
    starts = np.asarray(starts, dtype=np.int64).ravel()
    lengths = np.asarray(lengths, dtype=np.int64).ravel()
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    keep = lengths > 0
    starts, lengths = starts[keep], lengths[keep]
    # Each output element is its range start plus its offset inside the range.
    range_begin = np.cumsum(lengths) - lengths
    return np.repeat(starts - range_begin, lengths) + np.arange(total, dtype=np.int64)


def dual_chunk_swap_index(cu_padded: np.ndarray, cp_size: int, rank: int) -> np.ndarray:
    """Global token indices owned by ``rank`` under DualChunkSwap, in local buffer order.

    Local order per sequence is [chunk r, chunk 2cp-1-r], sequences in packed order (the layout
    Transformer Engine's ``thd_get_partitioned_indices`` produces).
    """
    chunk = np.diff(cu_padded) // (2 * cp_size)
    back = 2 * cp_size - 1 - rank
    starts = np.stack([cu_padded[:-1] + rank * chunk, cu_padded[:-1] + back * chunk], 1)
    return ranges_to_index(starts, np.stack([chunk, chunk], 1))


def no_load_balance_bounds(total_tokens: int, cp_size: int, rank: int) -> tuple[int, int]:
    """``[start, stop)`` of the contiguous block of the packed buffer owned by ``rank``."""
    block = total_tokens // cp_size
    return rank * block, (rank + 1) * block


def gather_tokens(x: torch.Tensor, index: torch.Tensor | tuple[int, int]) -> torch.Tensor:
    """Select local tokens: ``narrow`` for a contiguous block (no copy), else ``index_select``."""
    if isinstance(index, tuple):
        return x.narrow(0, index[0], index[1] - index[0])
    if index.device != x.device:
        raise ValueError(
            f"partition index is on {index.device} but the tensor is on {x.device}; "
            "call PackedBatch.to(device) once per batch"
        )
    return x.index_select(0, index)


def scatter_tokens(
    local: Sequence[torch.Tensor], indices: Sequence[torch.Tensor | tuple[int, int]], total: int
) -> torch.Tensor:
    """Inverse of :func:`gather_tokens` over all ranks: reassemble the packed buffer."""
    first = local[0]
    out = first.new_zeros((total, *first.shape[1:]))
    for part, index in zip(local, indices, strict=True):
        if isinstance(index, tuple):
            out[index[0] : index[1]] = part
        else:
            out.index_copy_(0, index.to(part.device), part)
    return out
