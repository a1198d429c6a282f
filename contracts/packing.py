"""Host-side packed-batch layout: ``cu_seqlens`` and ``cu_seqlens_padded`` as plain lists.

Kept free of torch so the spec can be checked, and the bundle's metadata facts computed, on any
machine. The workload turns these lists into tensors.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class PackedLayout:
    """Where every sequence sits in the packed (THD) buffer, unpadded and padded."""

    seqlens: tuple[int, ...]
    """Real (unpadded) sequence lengths."""
    cu_seqlens: tuple[int, ...]
    """Cumulative real lengths, starting at 0."""
    cu_seqlens_padded: tuple[int, ...]
    """Cumulative padded lengths: sequence i occupies ``[cu_seqlens_padded[i], ...[i+1])``."""
    token_alignment: int | None
    """The multiple the packed total was padded to, if any."""

    @property
    def total_tokens(self) -> int:
        """Tokens in the packed buffer, padding included (before CP partitioning)."""
        return self.cu_seqlens_padded[-1]

    @property
    def padded_equals_unpadded(self) -> bool:
        """True when every entry, the last included, is equal: there is no padding at all."""
        return self.cu_seqlens == self.cu_seqlens_padded


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def build_layout(
    seqlens: list[int],
    *,
    ranks: int,
    strategy: str,
    metadata: str,
    token_alignment: int | None,
) -> PackedLayout:
    """Lay out a pack for ``ranks``-way CP.

    ``metadata="real_padding"`` rounds every sequence up to a multiple of ``2 * ranks`` (what
    DualChunkSwap needs); the other modes pass padded metadata equal in value to the unpadded
    one, so the pack must need no padding. ``token_alignment`` pads the packed total (to a
    multiple of ``lcm(token_alignment, 2 * ranks)`` under DualChunkSwap) by growing the last
    sequence's padded slot; its real length is unchanged.

    :raises ValueError: the pack cannot be laid out as asked (the message says why).
    """
    chunk = 2 * ranks if strategy == "dual_chunk_swap" and ranks > 1 else 1
    if metadata == "real_padding":
        padded = [_round_up(s, chunk) for s in seqlens]
    else:
        padded = list(seqlens)
        bad = [s for s in seqlens if s % chunk]
        if bad:
            raise ValueError(
                f"DualChunkSwap needs every length divisible by 2*ranks={chunk}; {bad[:5]} are "
                "not (use metadata: real_padding)"
            )
    total = sum(padded)
    if token_alignment:
        # lcm: alignment padding must keep DualChunkSwap's divisibility (cp_attention does the
        # same in pad_to_multiple).
        aligned = _round_up(total, math.lcm(token_alignment, chunk))
        if aligned != total and metadata != "real_padding":
            raise ValueError(
                f"token_alignment {token_alignment} pads the total {total} to {aligned}, so "
                "padded and unpadded metadata differ; use metadata: real_padding"
            )
        padded[-1] += aligned - total
    if strategy == "no_load_balance" and sum(padded) % ranks:
        raise ValueError(
            f"NoLoadBalance needs the packed total ({sum(padded)}) divisible by ranks={ranks}"
        )
    return PackedLayout(
        seqlens=tuple(seqlens),
        cu_seqlens=tuple(itertools.accumulate(seqlens, initial=0)),
        cu_seqlens_padded=tuple(itertools.accumulate(padded, initial=0)),
        token_alignment=token_alignment,
    )
