"""Small numpy helpers the readers share.

Why not ``np.unique(..., return_inverse=True)`` everywhere: it sorts, and sorting millions of
ids dominates a read once the rows are out of SQLite. StringIds ids, device ids and the like are
small dense integers, for which a lookup table does the same job in linear time.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_DENSE_LIMIT = 1 << 26
"""Largest id for which a lookup table (8 bytes per possible id) is used instead of sorting."""


def factorize(values: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]:
    """Return ``(unique, inverse)`` with ``unique[inverse] == values`` and ``unique`` sorted."""
    if not len(values):
        return np.empty(0, dtype=values.dtype), np.empty(0, dtype=np.intp)
    low, high = int(values.min()), int(values.max())
    if high - low >= _DENSE_LIMIT:
        unique, inverse = np.unique(values, return_inverse=True)
        return unique, inverse.reshape(-1)
    shifted = values - low
    present = np.bincount(shifted, minlength=high - low + 1) > 0
    unique_shifted = np.flatnonzero(present)
    lookup = np.zeros(high - low + 1, dtype=np.intp)
    lookup[unique_shifted] = np.arange(len(unique_shifted))
    return (unique_shifted + low).astype(values.dtype), lookup[shifted]
