"""Move many small host tensors to a device with one copy per dtype.

A packed batch carries dozens of tiny index/offset tensors (per rank, per comm, per ring step).
Moving them one by one costs one ``cudaMemcpyAsync`` launch each (about 40 per batch on the
reference workload, seen in H200 traces as unattributed memcpy launches every step). Packing
them into one contiguous (pinned) host buffer per dtype turns that into one launch per dtype,
and the results are views (``narrow`` + ``view``) of the device buffer, so nothing else
changes for the kernels that read them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: Every leaf starts at a multiple of this many bytes in its buffer. Kernels (cuDNN, vectorized
#: loads) may assume the alignment a fresh allocation has; 16 bytes covers 128-bit loads.
ALIGN_BYTES = 16


def to_device_packed(
    leaves: Sequence[torch.Tensor], device: torch.device | str
) -> list[torch.Tensor]:
    """``[leaf.to(device) for leaf in leaves]``, with one host-to-device copy per dtype.

    Leaves of one dtype are copied, in order, into one contiguous host buffer (pinned when the
    target is CUDA, so the copy is truly asynchronous), which is moved with a single
    ``non_blocking`` copy; each result is a view of that device buffer with the leaf's shape
    (0-d and empty leaves included). Nothing is read back, so no device-to-host sync happens.

    Freeing the pinned buffer right after the copy is safe: PyTorch's caching host allocator
    records the copy's stream and reuses the block only once the copy has finished.

    :param leaves: tensors to move (any shape, any dtype, normally on the host).
    :param device: target device.
    :returns: the moved tensors, in the order of ``leaves``. On a CPU target they are views of
        one fresh host buffer per dtype (never the inputs themselves).
    """
    dev = torch.device(device)
    pin = dev.type == "cuda" and torch.cuda.is_available()
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, leaf in enumerate(leaves):
        by_dtype.setdefault(leaf.dtype, []).append(i)
    out: list[torch.Tensor | None] = [None] * len(leaves)
    for dtype, positions in by_dtype.items():
        group = [leaves[i] for i in positions]
        offsets, total = _aligned_offsets(group, dtype)
        host = torch.empty(total, dtype=dtype, pin_memory=pin)
        for leaf, start in zip(group, offsets, strict=True):
            host.narrow(0, start, leaf.numel()).copy_(leaf.reshape(-1))
        moved = host.to(dev, non_blocking=True)
        for i, leaf, start in zip(positions, group, offsets, strict=True):
            out[i] = moved.narrow(0, start, leaf.numel()).view(leaf.shape)
    return [t for t in out if t is not None]  # every slot was filled above


def _aligned_offsets(group: Sequence[torch.Tensor], dtype: torch.dtype) -> tuple[list[int], int]:
    """Start element of each leaf in the buffer (``ALIGN_BYTES``-aligned) and the buffer size."""
    step = max(1, ALIGN_BYTES // dtype.itemsize)
    offsets, cursor = [], 0
    for leaf in group:
        cursor = -(-cursor // step) * step  # round up to the alignment
        offsets.append(cursor)
        cursor += leaf.numel()
    return offsets, cursor
