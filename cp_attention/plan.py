"""Per-rank, per-CP-step attention calls, computed once per batch on the host.

A CP step attends the rank's local queries to one block of keys/values (P2P: the block of one
owner rank; all-gather: every rank's block). Which query rows see which key rows depends on the
partition strategy, the causal flag, the rank, the step and the padding. This module turns those
into plain kernel arguments (row selections, ``cu_seqlens`` for Q and KV, max lengths as Python
ints) so that the hot loop never computes metadata on the device and never reads a device value.

Vocabulary:

* a *slot* is one piece of every sequence inside a buffer, as arrays over sequences:
  position of the piece in its (padded) sequence, piece length, and row offset in the buffer;
* a *kind* is one attention segment per sequence: a list of query slots against a list of key
  slots, both in ascending sequence position;
* padding rows (sequence positions >= the real length) are clipped away from every segment, so
  they are never read as keys, their outputs stay exactly zero and their gradients are zero
  without any zero-fill kernel.

Causal segments use bottom-right alignment (the last query row sees the last key row), which
matches both the same-block diagonal step and the all-gather prefix attention.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from cp_attention.partition import ranges_to_index
from cp_attention.transfer import to_device_packed

COMMS = ("p2p", "all_gather")


@dataclass(frozen=True, slots=True)
class Rows:
    """The rows of a buffer one kernel call reads: a contiguous slice, or an index tensor."""

    start: int
    stop: int
    index: torch.Tensor | None = None

    @property
    def count(self) -> int:
        """Number of rows selected."""
        return self.stop - self.start if self.index is None else int(self.index.numel())

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of ``x`` (a view for a slice, a copy for an index)."""
        if self.index is None:
            return x[self.start : self.stop]
        return x.index_select(0, self.index)

    def covers(self, total: int) -> bool:
        """Whether the selection is every row of a ``total``-row buffer, in order."""
        return self.index is None and self.start == 0 and self.stop == total

    def to(self, device: torch.device) -> Rows:
        """Move the index (if any) to ``device``."""
        return self.with_tensors(iter(to_device_packed(self.tensors(), device)))

    def tensors(self) -> list[torch.Tensor]:
        """The tensor leaves, in the order :meth:`with_tensors` consumes them."""
        return [] if self.index is None else [self.index]

    def with_tensors(self, leaves: Iterator[torch.Tensor]) -> Rows:
        """The same selection with its leaves taken, in order, from ``leaves``."""
        if self.index is None:
            return self
        return Rows(self.start, self.stop, next(leaves))


@dataclass(frozen=True, slots=True)
class AttnCall:
    """Arguments of one local variable-length attention kernel call."""

    q_rows: Rows
    k_rows: Rows
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    causal: bool
    #: Every segment has as many keys as queries (causal top-left == bottom-right).
    square: bool = True
    #: For the TE-style A/B path: how many of the ``2*cp`` chunks of each padded sequence the
    #: Q/KV side holds, when the call's cu_seqlens are exactly that fraction (else None).
    q_chunks: int | None = None
    k_chunks: int | None = None
    #: Row of each segment's first query / key in the *unselected* buffer (int64, one per
    #: segment), when every segment's rows are contiguous there; else None. A kernel that
    #: addresses sequences by offset (cuDNN's ragged THD) then reads the buffers in place
    #: instead of gathering ``q_rows``/``k_rows`` into packed copies.
    q_starts: torch.Tensor | None = None
    k_starts: torch.Tensor | None = None
    #: Metadata a kernel backend derives from this call once (e.g. cuDNN ragged offsets).
    cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def in_place(self) -> bool:
        """Whether the kernel can read this call's rows in place (segment starts known)."""
        return self.q_starts is not None and self.k_starts is not None

    @property
    def gathers(self) -> bool:
        """Whether the packed form of this call copies rows (an index selection on a side)."""
        return self.q_rows.index is not None or self.k_rows.index is not None

    def to(self, device: torch.device) -> AttnCall:
        """Move every tensor to ``device``, one copy per dtype (host values stay as they are)."""
        return self.with_tensors(iter(to_device_packed(self.tensors(), device)))

    def tensors(self) -> list[torch.Tensor]:
        """The tensor leaves, in the order :meth:`with_tensors` consumes them."""
        starts = [t for t in (self.q_starts, self.k_starts) if t is not None]
        return [*self.q_rows.tensors(), *self.k_rows.tensors(), self.cu_q, self.cu_k, *starts]

    def with_tensors(self, leaves: Iterator[torch.Tensor]) -> AttnCall:
        """The same call with its leaves taken, in order, from ``leaves``.

        The ``cache`` starts empty: what a backend derived from the old tensors lives on their
        device, so it is recomputed from the new ones.
        """
        return AttnCall(
            self.q_rows.with_tensors(leaves),
            self.k_rows.with_tensors(leaves),
            next(leaves),
            next(leaves),
            self.max_q,
            self.max_k,
            self.causal,
            self.square,
            self.q_chunks,
            self.k_chunks,
            None if self.q_starts is None else next(leaves),
            None if self.k_starts is None else next(leaves),
        )

    def with_offsets(self, cu_q: torch.Tensor, cu_k: torch.Tensor) -> AttnCall:
        """The same call with other (value-equal) offsets (TE-style A/B path)."""
        return AttnCall(self.q_rows, self.k_rows, cu_q, cu_k, self.max_q, self.max_k,
                        self.causal, self.square, self.q_chunks, self.k_chunks, self.q_starts,
                        self.k_starts)


@dataclass(frozen=True, slots=True)
class Slot:
    """One piece of every sequence: position in the sequence, length, row offset in a buffer."""

    pos: np.ndarray
    length: np.ndarray
    row: np.ndarray


@dataclass(frozen=True, slots=True)
class Geometry:
    """Host-side description of a packed batch that the planners need."""

    cu_padded: np.ndarray
    real_len: np.ndarray
    cp_size: int
    strategy: str
    local_tokens: int

    @property
    def padded_len(self) -> np.ndarray:
        """Padded length of every sequence."""
        return np.diff(self.cu_padded)


def owner_slots(geom: Geometry, owner: int, base: int = 0) -> list[Slot]:
    """The slots of rank ``owner``'s local buffer (placed at row ``base`` of a bigger buffer)."""
    starts = geom.cu_padded[:-1]
    if geom.strategy == "dual_chunk_swap":
        chunk = geom.padded_len // (2 * geom.cp_size)
        local_start = base + np.cumsum(2 * chunk) - 2 * chunk
        back = 2 * geom.cp_size - 1 - owner
        return [
            Slot(owner * chunk, chunk, local_start),
            Slot(back * chunk, chunk, local_start + chunk),
        ]
    lo_block, hi_block = owner * geom.local_tokens, (owner + 1) * geom.local_tokens
    lo = np.maximum(starts, lo_block)
    hi = np.minimum(geom.cu_padded[1:], hi_block)
    return [Slot(lo - starts, np.maximum(hi - lo, 0), base + lo - lo_block)]


def build_call(
    kinds: list[tuple[list[Slot], list[Slot]]],
    geom: Geometry,
    causal: bool,
    chunks: tuple[int, int] | None = None,
) -> AttnCall | None:
    """Turn per-sequence segments into one kernel call, or None when nothing attends.

    Segments are ordered sequence-major, then by kind; empty segments (no real query rows or no
    real keys) are dropped so the kernel never sees a query without keys.
    """
    n_seq = geom.real_len.size
    width = max(max(len(q), len(k)) for q, k in kinds)
    shape = (n_seq, len(kinds), width)
    q_row, q_len = np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    k_row, k_len = np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    for kind, (q_slots, k_slots) in enumerate(kinds):
        for side_row, side_len, slots in ((q_row, q_len, q_slots), (k_row, k_len, k_slots)):
            for j, slot in enumerate(slots):
                side_row[:, kind, j] = slot.row
                # Real tokens are a prefix of each padded sequence: clip the piece to it.
                side_len[:, kind, j] = np.clip(geom.real_len - slot.pos, 0, slot.length)
    seg_q, seg_k = q_len.sum(2), k_len.sum(2)
    keep = (seg_q > 0) & (seg_k > 0)
    if not keep.any():
        return None
    q_len[~keep], k_len[~keep] = 0, 0
    has_padding = bool((geom.real_len != geom.padded_len).any())
    exact = chunks if chunks is not None and not has_padding and keep.all() else (None, None)
    q_index, k_index = ranges_to_index(q_row, q_len), ranges_to_index(k_row, k_len)
    cu_q, cu_k = _offsets(seg_q[keep]), _offsets(seg_k[keep])
    return AttnCall(
        q_rows=_rows(q_index),
        k_rows=_rows(k_index),
        cu_q=cu_q,
        cu_k=cu_k,
        max_q=int(seg_q[keep].max()),
        max_k=int(seg_k[keep].max()),
        causal=causal,
        square=bool(np.array_equal(seg_q[keep], seg_k[keep])),
        q_chunks=exact[0],
        k_chunks=exact[1],
        q_starts=_segment_starts(q_index, cu_q.numpy()),
        k_starts=_segment_starts(k_index, cu_k.numpy()),
    )


def _segment_starts(index: np.ndarray, cu: np.ndarray) -> torch.Tensor | None:
    """Buffer row of each segment's first row, when every segment is contiguous; else None."""
    lengths = np.diff(cu)
    starts = index[cu[:-1]]
    expect = np.repeat(starts - cu[:-1], lengths) + np.arange(index.size, dtype=np.int64)
    if not np.array_equal(index, expect) or (np.diff(starts) < 0).any():
        return None
    return torch.from_numpy(starts.astype(np.int64))


def _rows(index: np.ndarray) -> Rows:
    """A slice when the rows are contiguous and ascending, else an index tensor."""
    first = int(index[0])
    if np.array_equal(index, np.arange(first, first + index.size)):
        return Rows(first, first + index.size)
    return Rows(0, index.size, torch.from_numpy(index))


def _offsets(lengths: np.ndarray) -> torch.Tensor:
    """int32 cumulative offsets, as variable-length kernels take them."""
    return torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))


def p2p_calls(geom: Geometry, rank: int, causal: bool) -> tuple[AttnCall | None, ...]:
    """One call per ring step ``i``; step ``i`` holds the KV block of rank ``(rank - i) % cp``."""
    cp = geom.cp_size
    mine = owner_slots(geom, rank)
    calls: list[AttnCall | None] = []
    for step in range(cp):
        owner = (rank - step) % cp
        theirs = owner_slots(geom, owner)
        if geom.strategy == "dual_chunk_swap":
            calls.append(_dual_chunk_step(geom, mine, theirs, step, owner, rank, causal))
        elif not causal or owner < rank:
            # Blocks are disjoint: an earlier block is fully visible, a later one invisible.
            calls.append(build_call([(mine, theirs)], geom, causal=False))
        elif owner == rank:
            calls.append(build_call([(mine, mine)], geom, causal=True))
        else:
            calls.append(None)
    return tuple(calls)


def _dual_chunk_step(
    geom: Geometry,
    mine: list[Slot],
    theirs: list[Slot],
    step: int,
    owner: int,
    rank: int,
    causal: bool,
) -> AttnCall | None:
    """DualChunkSwap ring step: diagonal, KV-front-half, or Q-back-half (as in TE's P2P)."""
    if not causal:
        return build_call([(mine, theirs)], geom, causal=False, chunks=(2, 2))
    if step == 0:
        return build_call([(mine, mine)], geom, causal=True, chunks=(2, 2))
    if owner < rank:
        # Owner's front chunk precedes both of ours; its back chunk follows both.
        return build_call([(mine, theirs[:1])], geom, causal=False, chunks=(2, 1))
    # Owner's chunks both precede our back chunk and follow our front chunk.
    return build_call([(mine[1:], theirs)], geom, causal=False, chunks=(1, 2))


@dataclass(frozen=True, slots=True)
class GatherOrder:
    """How all-gather CP of one rank moves the gathered KV into sequence order and back.

    The all-gather returns the owners' blocks in rank order; under DualChunkSwap the chunks of
    one sequence are then spread over every block, so no run of keys a query sees is
    contiguous. Permuted once into the packed batch's own order (every sequence's rows in
    position order, as in ``cu_seqlens_padded``), each query chunk sees one contiguous
    prefix of its sequence, and the rank's attention is one or two kernel calls with offset
    addressing (:func:`gather_calls`) instead of one call per owner block.

    * ``to_seq``: for every row of the sequence-ordered buffer, its row in the gathered
      (owner-ordered) buffer; None when the two orders are the same (NoLoadBalance);
    * ``grad_src[c]``: for every row of the gathered buffer, the sequence-ordered row whose
      dK/dV call ``c`` wrote, or -1 when call ``c`` reads no key there (a gathered row's
      gradient is the sum over calls, so the permutation back and the sum are one pass).
    """

    to_seq: torch.Tensor | None
    grad_src: tuple[torch.Tensor, ...]

    def tensors(self) -> list[torch.Tensor]:
        """The tensor leaves, in the order :meth:`with_tensors` consumes them."""
        return [*([] if self.to_seq is None else [self.to_seq]), *self.grad_src]

    def with_tensors(self, leaves: Iterator[torch.Tensor]) -> GatherOrder:
        """The same order with its leaves taken, in order, from ``leaves``."""
        to_seq = None if self.to_seq is None else next(leaves)
        return GatherOrder(to_seq, tuple(next(leaves) for _ in self.grad_src))


def gather_calls(geom: Geometry, rank: int, causal: bool,
                 owner_rows: np.ndarray) -> tuple[tuple[AttnCall, ...], GatherOrder]:
    """The calls of all-gather CP over the sequence-ordered KV, and the :class:`GatherOrder`.

    Keys are addressed in the packed batch's order (sequence ``s`` at rows
    ``cu_seqlens_padded[s]..``). Causal DualChunkSwap: two calls, our front chunk against
    chunks ``0..r`` and our back chunk against chunks ``0..2cp-1-r`` (each a prefix of its
    sequence ending at the chunk itself: bottom-right causal). Within a call no two segments
    share a query or a key row, so each call's outputs and dK/dV can be written in place, and
    the two calls' query rows are disjoint, so the forward needs no log-sum-exp merge of
    partial outputs. Otherwise one call (all our queries against the visible prefix, or the
    whole sequence when not causal; at cp = 1 the two chunks are the whole sequence).

    :param owner_rows: for every row of the gathered buffer (owner blocks in rank order), its
        row in the packed batch (the partitions of ranks ``0..cp-1``, concatenated).
    """
    starts = geom.cu_padded[:-1]
    zeros = np.zeros_like(starts)
    mine = owner_slots(geom, rank)

    def prefix(length: np.ndarray) -> list[Slot]:
        return [Slot(zeros, length, starts)]

    if not causal:
        kinds = [[(mine, prefix(geom.padded_len))]]
    elif geom.strategy == "dual_chunk_swap" and geom.cp_size > 1:
        chunk = geom.padded_len // (2 * geom.cp_size)
        kinds = [[(mine[:1], prefix((rank + 1) * chunk))],
                 [(mine[1:], prefix((2 * geom.cp_size - rank) * chunk))]]
    else:
        kinds = [[(mine, prefix(mine[-1].pos + mine[-1].length))]]
    calls = tuple(c for c in (build_call(k, geom, causal) for k in kinds) if c is not None)
    total = owner_rows.size
    identity = np.array_equal(owner_rows, np.arange(total))
    to_seq = None
    if not identity:
        inverse = np.empty(total, dtype=np.int64)
        inverse[owner_rows] = np.arange(total, dtype=np.int64)
        to_seq = torch.from_numpy(inverse)
    grad_src = []
    for call in calls:
        read = np.zeros(total, dtype=bool)
        rows = call.k_rows
        if rows.index is None:
            read[rows.start : rows.stop] = True
        else:
            read[rows.index.numpy()] = True
        grad_src.append(torch.from_numpy(np.where(read[owner_rows], owner_rows, -1)))
    return calls, GatherOrder(to_seq, tuple(grad_src))


@dataclass(frozen=True, slots=True)
class JointBwd:
    """One backward call that replaces every ring step's backward of a rank (saved-KV P2P).

    When every step attends *all* of a rank's queries to keys that, per sequence, form one
    run of positions ending at the rank's own last row, the per-step backward calls (each with
    its own dO·O pre-pass, dQ conversion and a dQ sum afterwards) are one causal call over a
    packed KV buffer: per sequence, the rows each step read, in position order. Under
    DualChunkSwap this is rank ``cp - 1`` (its two chunks are adjacent; every peer's front
    chunk precedes them). Per ring step ``i`` (block held at step ``i``):

    * ``pack_src[i]`` rows of block ``i`` go to rows ``pack_dst[i]`` of the packed buffer;
    * ``grad_src[i]`` gives, for every row of block ``i``, its packed row (or -1 when the
      joint call does not read it), so block ``i``'s dK/dV are one gather of the packed ones.
    """

    call: AttnCall
    k_total: int
    pack_src: tuple[torch.Tensor, ...]
    pack_dst: tuple[torch.Tensor, ...]
    grad_src: tuple[torch.Tensor, ...]

    def tensors(self) -> list[torch.Tensor]:
        """The tensor leaves, in the order :meth:`with_tensors` consumes them."""
        return [*self.call.tensors(), *self.pack_src, *self.pack_dst, *self.grad_src]

    def with_tensors(self, leaves: Iterator[torch.Tensor]) -> JointBwd:
        """The same plan with its leaves taken, in order, from ``leaves``."""
        n = len(self.pack_src)
        call = self.call.with_tensors(leaves)
        src, dst, grad = ([next(leaves) for _ in range(n)] for _ in range(3))
        return JointBwd(call, self.k_total, tuple(src), tuple(dst), tuple(grad))


def joint_bwd_plan(geom: Geometry, rank: int, causal: bool) -> JointBwd | None:
    """The :class:`JointBwd` of ``rank``, or None when its steps do not form one call."""
    cp = geom.cp_size
    if not causal or geom.strategy != "dual_chunk_swap" or cp < 2 or rank != cp - 1:
        return None
    chunk = geom.padded_len // (2 * cp)
    # Piece o of every sequence is chunk o (o = 0 .. cp): peers' front chunks, then ours.
    lens = [np.clip(geom.real_len - o * chunk, 0, chunk) for o in range(cp + 1)]
    seg_q = lens[cp - 1] + lens[cp]
    keep = seg_q > 0  # then chunks 0 .. cp-2 are all real: the keys are one run from 0
    seg_k = np.where(keep, sum(lens), 0)
    base = np.cumsum(seg_k) - seg_k
    mine = owner_slots(geom, rank)
    packed = [Slot(o * chunk, chunk, base + o * chunk) for o in range(cp + 1)]
    call = build_call([(mine, packed)], geom, causal=True)
    if call is None:
        return None
    k_total = int(seg_k.sum())
    assert call.k_rows.covers(k_total), "joint keys must fill the packed buffer in order"
    pack_src, pack_dst, grad_src = [], [], []
    for step in range(cp):
        owner = (rank - step) % cp
        if step == 0:
            src_row, dst_row, n = mine[0].row, base + (cp - 1) * chunk, seg_q
        else:
            src_row, dst_row = owner_slots(geom, owner)[0].row, base + owner * chunk
            n = np.where(keep, chunk, 0)
        src = ranges_to_index(src_row, np.where(keep, n, 0))
        dst = ranges_to_index(dst_row, np.where(keep, n, 0))
        grad = np.full(geom.local_tokens, -1, dtype=np.int64)
        grad[src] = dst
        pack_src.append(torch.from_numpy(src))
        pack_dst.append(torch.from_numpy(dst))
        grad_src.append(torch.from_numpy(grad))
    return JointBwd(call, k_total, tuple(pack_src), tuple(pack_dst), tuple(grad_src))
