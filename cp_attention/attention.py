"""Context-parallel attention over packed (THD) sequences: P2P ring and all-gather.

The sharding lives here; the math lives in :mod:`cp_attention.local_attention` and the
per-step metadata in :class:`cp_attention.PackedBatch` (planned once per batch on the host).
Forward and backward use the comm, strategy and causal flag captured at forward time.

P2P ring (step ``i`` holds the KV block of rank ``(rank - i) % cp``): the next block is sent
and received while the current block computes; partial outputs are merged by log-sum-exp.
The backward passes KV around the ring again, together with the dK/dV accumulated for each
block, which arrives back at its owner after one extra hop. All-gather: KV is gathered once and
put in sequence order, one or two kernel calls attend every local query to its visible keys
(:func:`cp_attention.plan.gather_calls`), and dK/dV, moved back to owner order, are
reduce-scattered to their owners.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from cp_attention import fused
from cp_attention.broken import recompute_step_cu, zero_fill_padding
from cp_attention.graphs import StepGraphs
from cp_attention.local_attention import LocalAttention, get_backend
from cp_attention.merge import (
    OutputMerger,
    accum_dtype,
    add_block_rows,
    add_rows,
    gather_rows,
    gather_sum,
    sum_parts,
)
from cp_attention.metadata import PackedBatch
from cp_attention.plan import COMMS, AttnCall, JointBwd, Rows
from cp_attention.ranges import phase
from cp_attention.ring import (
    LoopbackGather,
    LoopbackRing,
    Ring,
    all_gather_tokens,
    reduce_scatter_tokens,
)


@dataclass(frozen=True, slots=True)
class Tuning:
    """How a rank's local work runs. The defaults are the fastest measured; the single-GPU
    floor benchmark turns each off alone (A/B) to measure what it buys. Numbers do not change.

    * ``fused_merge``: the log-sum-exp merge of a step as one kernel (CUDA with Triton) instead
      of ~10 eager ones;
    * ``in_place``: calls whose segments are contiguous in their buffers run on the whole
      buffers with offset addressing (cuDNN), instead of gathering rows into packed copies and
      scattering the results back;
    * ``remote_rows``: (saved-KV backward) the owner of a KV block adds a peer's dK/dV only at
      the rows the peer's step read, so the peer need not zero-fill the others;
    * ``dq_rows``: (saved-KV backward) the dQ of an in-place step that covers only some query
      rows is added at those rows only, instead of zero-filling the rest and adding the whole
      buffer;
    * ``joint_bwd`` (off): (saved-KV backward) a rank whose steps form one causal call over a
      packed KV (:class:`~cp_attention.plan.JointBwd`: DualChunkSwap rank ``cp - 1``) runs its
      whole backward as that one call, so the per-call dO·O pre-pass, dQ conversion and the dQ
      sums run once, at the price of packing the KV and gathering each block's dK/dV back.
      Measured on one H200 (reference workload): cp=2 rank 1 7.60 vs 6.19 ms (the bottom-right
      causal cuDNN backward over the packed KV runs 1.4x slower than the two step calls, and
      packing costs more than the adds it saves); cp=4 rank 3 4.24 vs 4.41 ms. Off because it
      loses at cp=2 and because the dK/dV of remote blocks are then ready only after the whole
      call, so on the network their return no longer overlaps the local step (unmeasured).
    * ``dq_fp32`` (off): (saved-KV backward) every step's backward is asked for a float32 dQ
      (cuDNN: no ``convert_dq_to_16bits`` kernel per call) and the steps' dQ are summed, each
      at its rows, in one pass that rounds once to the input dtype (instead of a 16-bit add
      per extra step). cuDNN 9.19 does not honour a float32 dQ (the backend checks once and
      returns 16-bit dQ), so on H200 it only merges the adds into one pass: cp=2 rank 0 5.91
      vs 5.85 ms, rank 1 6.16 vs 6.15; cp=4 ranks 1-3 0.03-0.05 ms less (run 8).
    * ``peer_sum``: (saved-KV backward, with ``remote_rows``) the ``cp - 1`` peers' dK/dV for
      our block are added to ours in one pass per tensor (float32 sum at each peer's rows,
      rounded once; :func:`~cp_attention.merge.sum_parts`, one kernel per four parts) instead
      of one add per peer, each rounded: launches and passes over the block stop growing with
      ``cp`` as fast (cp=8: 4 instead of 14 per layer).
    """

    fused_merge: bool = True
    in_place: bool = True
    remote_rows: bool = True
    dq_rows: bool = True
    joint_bwd: bool = False
    dq_fp32: bool = False
    peer_sum: bool = True


@dataclass(frozen=True, slots=True)
class CPConfig:
    """How to run CP attention; captured at forward time and reused by backward."""

    group: dist.ProcessGroup | None = None
    comm: str = "p2p"
    causal: bool = True
    softmax_scale: float | None = None
    broken_identity_padding: bool = False
    broken_always_zero_fill: bool = False
    backend: str | None = None
    #: P2P: keep the KV blocks received in forward for backward (memory: cp-1 local KV
    #: blocks), so backward needs no KV ring and its dK/dV return overlaps the local step.
    save_remote_kv: bool = True
    #: Run forward and backward through CUDA graphs captured per layout (:data:`GRAPHS`).
    graphs: bool = False

    def __post_init__(self) -> None:
        if self.comm not in COMMS:
            raise ValueError(f"comm must be one of {COMMS}, got {self.comm!r}")


@dataclass(frozen=True, slots=True)
class _Step:
    """What one forward/backward pass needs besides tensors."""

    cfg: CPConfig
    meta: PackedBatch
    rank: int
    calls: tuple[AttnCall | None, ...]
    kernel: LocalAttention
    scale: float
    tuning: Tuning = Tuning()

    def _in_place(self, call: AttnCall, kind: str):
        """The kernel's in-place method for ``call`` when it applies, else None."""
        if not (self.tuning.in_place and call.in_place and call.gathers):
            return None
        return getattr(self.kernel, f"{kind}_in_place", None)

    def call(self, index: int) -> AttnCall | None:
        """The planned call of step ``index``, recomputed on device in the TE-style A/B mode."""
        call = self.calls[index]
        if call is not None and self.cfg.broken_identity_padding:
            call = recompute_step_cu(call, self.meta, self.rank)
        return call

    def fwd(self, call: AttnCall, q, k, v):
        """``(out, lse, in_place)``: in place, the results have every local row."""
        with phase("attn_fwd_step"):
            run = self._in_place(call, "fwd")
            if run is not None:
                res = run(q, k, v, call, self.scale)
                if res is not None:
                    return res[0], res[1], True
            out, lse = self.kernel.fwd(
                call.q_rows.take(q), call.k_rows.take(k), call.k_rows.take(v), call.cu_q,
                call.cu_k, call.max_q, call.max_k, call.causal, self.scale, call.square,
                cache=call.cache,
            )
            return out, lse, False

    def bwd(self, call: AttnCall, dout, q, k, v, out, lse, zero_k_outside: bool = True,
            zero_q_outside: bool = True, dq_dtype: torch.dtype | None = None):
        """``(dq, dk, dv, in_place)``: in place, whole buffers, zero outside the call's rows
        (dK/dV rows outside undefined when ``zero_k_outside`` is False, dQ rows when
        ``zero_q_outside`` is False). ``dq_dtype``: ask the kernel for dQ in that dtype (a
        kernel that cannot returns the input dtype)."""
        extra = ({"dq_dtype": dq_dtype}
                 if dq_dtype is not None and getattr(self.kernel, "accepts_dq_dtype", False)
                 else {})
        with phase("attn_bwd_step"):
            run = self._in_place(call, "bwd")
            if run is not None:
                res = run(dout, q, k, v, out, lse, call, self.scale, zero_k_outside,
                          zero_q_outside, **extra)
                if res is not None:
                    return (*res, True)
            rows = call.q_rows
            return (*self.kernel.bwd(
                rows.take(dout), rows.take(q), call.k_rows.take(k), call.k_rows.take(v),
                rows.take(out), rows.take(lse), call.cu_q, call.cu_k, call.max_q, call.max_k,
                call.causal, self.scale, call.square, cache=call.cache, **extra,
            ), False)

    @property
    def fused(self) -> bool:
        """Whether the one-kernel merge/add paths run (CUDA with Triton)."""
        return self.tuning.fused_merge and fused.available()

    def merger(self, q) -> OutputMerger:
        return OutputMerger(q, fused=self.fused and q.is_cuda)

    def joint(self) -> JointBwd | None:
        """This rank's one-call backward plan when it applies and is switched on."""
        if not self.tuning.joint_bwd:
            return None
        return self.meta.joint_bwd(self.cfg.causal, self.rank)

    def peer_call(self, step: int) -> AttnCall | None:
        """The call rank ``rank + step`` runs on our KV block at its ring step ``step``."""
        peer = (self.rank + step) % self.meta.cp_size
        return self.meta.calls_for("p2p", self.cfg.causal, peer)[step]

    def peer_rows(self, step: int) -> Rows | None:
        """Rows of our KV block that rank ``rank + step`` reads at its ring step ``step``."""
        call = self.peer_call(step)
        return None if call is None else call.k_rows


def _ring_forward(s: _Step, q, k, v, ring: Ring | LoopbackRing | None):
    """Returns ``(out, lse, kv blocks held at each step)``."""
    merger = s.merger(q)
    kv = [k, v]
    blocks = [kv]
    for index in range(len(s.calls)):
        pending = ring.exchange(kv, kv) if ring is not None and index < ring.size - 1 else None
        call = s.call(index)
        if call is not None:
            out, lse, in_place = s.fwd(call, q, kv[0], kv[1])
            with phase("merge"):
                merger.add(call.q_rows, out, lse, in_place)
        if pending is not None:
            kv = pending.wait()
            blocks.append(kv)
    with phase("merge"):
        out, lse = merger.result()
    return out, lse, blocks


def _saved_kv_backward(s: _Step, dout, q, blocks, out, lse, ring: Ring | LoopbackRing | None):
    """P2P backward over the KV blocks saved in forward.

    Remote blocks go first; their dK/dV go straight back to their owners while the local
    (diagonal) block, the largest, computes. Contributions are summed in a fixed order, in the
    input dtype (one rounding per added block, as TE does).
    """
    joint = s.joint()
    if joint is not None:
        return _joint_backward(s, joint, dout, q, blocks, out, lse, ring)
    k, v = blocks[0]
    dq: torch.Tensor | None = None
    # dQ of in-place steps valid only at their rows (dq_rows), summed after the loop.
    partial_dq: list[tuple[torch.Tensor, Rows]] = []
    # dq_fp32: every step's float32 dQ with its valid rows, summed once after the loop.
    dq_parts: list[tuple[torch.Tensor, Rows | None, dict | None]] = []
    fp32 = s.tuning.dq_fp32
    dq_dtype = accum_dtype(q.dtype) if fp32 else None
    sends: list[tuple[list[torch.Tensor], int]] = []
    for index in range(len(s.calls) - 1, -1, -1):
        if index == 0 and ring is not None and ring.size > 1:
            # Owner of step i's block is rank - i; rank + i holds our block at its step i.
            pending = ring.exchange_pairs(
                sends, [([k, v], (ring.rank + i) % ring.size) for i in range(1, ring.size)])
        call = s.call(index)
        bk, bv = blocks[index]
        # A remote block's dK/dV may keep garbage outside the rows the step read: its owner
        # adds only those rows (peer_rows), so no zero-fill is needed for them.
        zero = index == 0 or not s.tuning.remote_rows
        zero_q = not (s.tuning.dq_rows or fp32)
        grads = (s.bwd(call, dout, q, bk, bv, out, lse, zero, zero_q, dq_dtype)
                 if call is not None else None)
        with phase("grad_reduce"):
            # grads is None exactly when call is None (the step has no work on this rank)
            if grads is not None and call is not None and fp32:
                dq_parts.append(_dq_part(grads[0], call, s.calls[index], q, grads[3]))
            elif grads is not None and call is not None and grads[3] and s.tuning.dq_rows \
                    and not call.q_rows.covers(q.shape[0]):
                partial_dq.append((grads[0], call.q_rows))
            elif grads is not None and call is not None:
                dq = add_rows(dq, call.q_rows, grads[0], q, q.dtype, grads[3])
            block = [_block_grad(None, call.k_rows if call else None,
                                 grads[1 + i] if grads else None, (bk, bv)[i],
                                 bool(grads and grads[3])) for i in range(2)]
        if index > 0:
            assert ring is not None  # steps past the first exist only with peers
            sends.append((block, (ring.rank - index) % ring.size))
    if ring is not None and ring.size > 1:
        received = pending.wait()
        with phase("grad_reduce"):
            if s.tuning.remote_rows and s.tuning.peer_sum:
                block = [_sum_peer_grads(s, block[t], received[t::2]) for t in range(2)]
                received = []
            for j, step in enumerate(range(1, ring.size) if received else ()):
                if s.tuning.remote_rows:
                    rows = s.peer_rows(step)
                    add_block_rows(block[0], received[2 * j], rows, s.fused)
                    add_block_rows(block[1], received[2 * j + 1], rows, s.fused)
                else:
                    block[0] += received[2 * j]
                    block[1] += received[2 * j + 1]
    with phase("grad_reduce"):
        if fp32:
            dq = sum_parts(dq_parts, q, s.fused)
        dq = dq if dq is not None else torch.zeros_like(q)
        for part, rows in partial_dq:
            add_block_rows(dq, part, rows, s.fused)
    return dq.to(q.dtype), block[0].to(k.dtype), block[1].to(v.dtype)


def _sum_peer_grads(s: _Step, own: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    """``own`` plus each peer's gradient for our block (``grads[i]`` from ring step ``i + 1``),
    each read only at the rows that peer's step read, summed in one pass, rounded once."""
    parts: list[tuple[torch.Tensor, Rows | None, dict | None]] = [(own, None, None)]
    for step, grad in enumerate(grads, start=1):
        call = s.peer_call(step)
        if call is not None:  # the peer's own call caches the device mask of its key rows
            parts.append((grad, call.k_rows, call.cache.setdefault("peer_grad_masks", {})))
    return sum_parts(parts, own, s.fused)


def _dq_part(dq: torch.Tensor, call: AttnCall, planned: AttnCall | None, q: torch.Tensor,
             in_place: bool) -> tuple[torch.Tensor, Rows | None, dict | None]:
    """A step's dQ as a :func:`~cp_attention.merge.sum_parts` part: a whole-buffer tensor and
    the rows where it is valid (None: every row)."""
    rows = call.q_rows
    cache = planned.cache if planned is not None else call.cache
    if rows.covers(q.shape[0]):
        return dq, None, None
    if in_place:  # whole buffer, valid at the call's rows (the rest never written)
        return dq, rows, cache
    # A packed partial result (not in place): scattered into a zero buffer once.
    return add_rows(None, rows, dq, q, dq.dtype), None, None


def _joint_backward(
    s: _Step, j: JointBwd, dout, q, blocks, out, lse, ring: Ring | LoopbackRing | None
):
    """P2P backward of a rank whose steps are one call (:class:`~cp_attention.plan.JointBwd`).

    The rows every step read are packed into one KV buffer, one backward call runs over it,
    and each block's dK/dV are gathered back out of the packed gradient: remote blocks' to
    their owners (zero outside the rows read), ours summed with what the peers send.
    """
    k, v = blocks[0]
    fused = s.fused
    if s.cfg.broken_identity_padding:
        for index in range(len(s.calls)):
            s.call(index)  # TE's per-step offset arithmetic (time only; the joint call's own)
    with phase("grad_reduce"):
        packed = [k.new_empty((j.k_total, *k.shape[1:])), v.new_empty((j.k_total, *v.shape[1:]))]
        for i, (bk, bv) in enumerate(blocks):
            gather_rows(packed[0], j.pack_dst[i], bk, j.pack_src[i], fused=fused)
            gather_rows(packed[1], j.pack_dst[i], bv, j.pack_src[i], fused=fused)
    dq, dk, dv, in_place = s.bwd(j.call, dout, q, packed[0], packed[1], out, lse)
    with phase("grad_reduce"):
        dq = add_rows(None, j.call.q_rows, dq, q, q.dtype, in_place)
        if in_place:  # whole-buffer results: the packed buffer is the call's KV exactly
            dk, dv = dk[: j.k_total], dv[: j.k_total]
        sends = []
        for i in range(1, len(blocks)):
            grads = [torch.empty_like(t) for t in blocks[i]]
            gather_rows(grads[0], None, dk, j.grad_src[i], fused=fused)
            gather_rows(grads[1], None, dv, j.grad_src[i], fused=fused)
            sends.append((grads, (s.rank - i) % s.meta.cp_size))
    size = s.meta.cp_size
    if ring is None or ring.size == 1:
        received: list[torch.Tensor] = []
    else:
        received = ring.exchange_pairs(
            sends, [([k, v], (ring.rank + i) % ring.size) for i in range(1, ring.size)]).wait()
    with phase("grad_reduce"):
        # Our block: the packed rows plus, in one pass, a peer's gradient that covers it.
        steps = list(range(1, size)) if received else []
        rows = {step: s.peer_rows(step) if s.tuning.remote_rows else Rows(0, k.shape[0])
                for step in steps}
        base = next((st for st in steps if (r := rows[st]) is not None
                     and r.covers(k.shape[0])), None)
        block = [torch.empty_like(k), torch.empty_like(v)]
        for t in range(2):
            other = None if base is None else received[2 * (base - 1) + t]
            gather_rows(block[t], None, (dk, dv)[t], j.grad_src[0], other, fused=fused)
        for step in steps:
            if step != base:
                for t in range(2):
                    add_block_rows(block[t], received[2 * (step - 1) + t], rows[step], fused)
    return dq.to(q.dtype), block[0].to(k.dtype), block[1].to(v.dtype)


def _ring_backward(s: _Step, dout, q, k, v, out, lse, ring: Ring | None):
    dq: torch.Tensor | None = None
    kv: list[torch.Tensor] = [k, v]
    dkv_out: list[torch.Tensor] = []
    for index in range(len(s.calls)):
        pass_kv = ring is not None and index < ring.size - 1
        send = list(kv) if pass_kv else []
        recv_like = list(kv) if pass_kv else []
        if index > 0:
            # dK/dV of a block travel the ring one step behind its KV: we send what we
            # accumulated for the previous block and receive this block's running sum.
            send += dkv_out
            recv_like += [k, v]
        pending = ring.exchange(send, recv_like) if ring is not None and send else None
        call = s.call(index)
        grads = None
        if call is not None:
            grads = s.bwd(call, dout, q, kv[0], kv[1], out, lse)
            with phase("grad_reduce"):
                dq = add_rows(dq, call.q_rows, grads[0], q, q.dtype, grads[3])
        received = pending.wait() if pending is not None else []
        incoming = received[-2:] if index > 0 else [None, None]
        with phase("grad_reduce"):
            dkv_out = [
                _block_grad(incoming[i], call.k_rows if call else None,
                            grads[1 + i] if grads else None, kv[i], bool(grads and grads[3]))
                for i in range(2)
            ]
        kv = received[:2] if pass_kv else kv
    if ring is not None and ring.size > 1:
        # Final hop: every block's gradient returns to its owner.
        dkv_out = ring.exchange(dkv_out, [k, v]).wait()
    dq = dq if dq is not None else torch.zeros_like(q)
    return dq.to(q.dtype), dkv_out[0].to(k.dtype), dkv_out[1].to(v.dtype)


def _block_grad(incoming, rows: Rows | None, contrib, like, in_place: bool = False):
    """Add this rank's contribution to a KV block's running gradient (block dtype on the wire).

    ``in_place``: ``contrib`` already has every row of the block (zero outside ``rows``).
    """
    if contrib is None:
        return incoming if incoming is not None else torch.zeros_like(like)
    assert rows is not None
    if in_place:
        if incoming is None:
            return contrib.to(like.dtype)
        incoming += contrib.to(like.dtype)
        return incoming
    if incoming is None:
        if rows.covers(like.shape[0]):
            return contrib.to(like.dtype)
        incoming = torch.zeros_like(like)
    if rows.index is None:
        incoming[rows.start : rows.stop] += contrib.to(like.dtype)
    else:
        incoming.index_add_(0, rows.index, contrib.to(like.dtype))
    return incoming


def _sequence_order(s: _Step, kg: torch.Tensor, vg: torch.Tensor):
    """The gathered K and V (owner blocks in rank order) in the packed batch's sequence order,
    which the all-gather calls address (:class:`~cp_attention.plan.GatherOrder`)."""
    to_seq = s.meta.gather_order(s.cfg.causal, s.rank).to_seq
    if to_seq is None:
        return kg, vg
    with phase("partition"):
        return kg.index_select(0, to_seq), vg.index_select(0, to_seq)


def _gather_forward(s: _Step, q, kseq, vseq):
    """``(out, lse)`` of the all-gather calls over the sequence-ordered KV. The calls' query
    rows are disjoint, so each merge only places a call's rows (exact: no rounding)."""
    merger = s.merger(q)
    for index in range(len(s.calls)):
        call = s.call(index)
        if call is not None:
            out, lse, in_place = s.fwd(call, q, kseq, vseq)
            with phase("merge"):
                merger.add(call.q_rows, out, lse, in_place)
    with phase("merge"):
        return merger.result()


def _gather_backward(s: _Step, dout, q, kseq, vseq, out, lse):
    """``(dq, dk, dv)``: dQ of the local rows, dK/dV of every gathered row in owner order
    (what the reduce-scatter sums), each rounded once to the input dtype.

    In-place calls leave the rows they do not read unwritten; dQ is summed over the calls at
    their query rows, and dK/dV are summed over the calls and moved back to owner order in one
    pass (:attr:`GatherOrder.grad_src`)."""
    acc = accum_dtype(q.dtype)
    order = s.meta.gather_order(s.cfg.causal, s.rank)
    dq_parts: list[tuple[torch.Tensor, Rows | None, dict | None]] = []
    dk_parts: list[tuple[torch.Tensor, torch.Tensor]] = []
    dv_parts: list[tuple[torch.Tensor, torch.Tensor]] = []
    for index in range(len(s.calls)):
        call = s.call(index)
        if call is None:
            continue
        dq_c, dk_c, dv_c, in_place = s.bwd(call, dout, q, kseq, vseq, out, lse,
                                           zero_k_outside=False, zero_q_outside=False)
        with phase("grad_reduce"):
            if in_place:
                dq_parts.append((dq_c, call.q_rows, call.cache.setdefault("gather_dq", {})))
            else:
                dq_parts.append((add_rows(None, call.q_rows, dq_c, q, acc), None, None))
                dk_c = add_rows(None, call.k_rows, dk_c, kseq, kseq.dtype)
                dv_c = add_rows(None, call.k_rows, dv_c, vseq, vseq.dtype)
            dk_parts.append((dk_c, order.grad_src[index]))
            dv_parts.append((dv_c, order.grad_src[index]))
    with phase("grad_reduce"):
        dq = sum_parts(dq_parts, q, s.fused)
        dk, dv = torch.empty_like(kseq), torch.empty_like(vseq)
        for dest, parts in ((dk, dk_parts), (dv, dv_parts)):
            if parts:
                gather_sum(dest, parts, s.fused)
            else:
                dest.zero_()
    return dq, dk, dv


#: The graphs ``cp_attn(..., graphs=True)`` replays: forward and backward per layout.
GRAPHS = StepGraphs()


def _meta_layout(meta: PackedBatch) -> tuple:
    """What a captured step depends on in a batch's metadata (values, not objects)."""
    return (meta.cu_seqlens, meta.cu_seqlens_padded, meta.cp_size, meta.strategy,
            str(meta.device))


def _layout(s: _Step, kind: str, ring: Ring | None, *extra: object) -> tuple:
    """The graph cache key of one pass of ``s`` (the tensors' shapes are added by the cache)."""
    group = None if ring is None else (id(ring.group), ring.rank, ring.size)
    return (kind, _meta_layout(s.meta), s.rank, s.cfg, s.kernel.name, s.scale, s.tuning, group,
            *extra)


def _forward(s: _Step, q, k, v, ring: Ring | None, gather: bool) -> tuple[torch.Tensor, ...]:
    """``(out, lse, *rest)``: all-gather: the K and V in sequence order; P2P: the remote KV
    blocks."""
    if gather:
        kg, vg = all_gather_tokens(k, s.cfg.group), all_gather_tokens(v, s.cfg.group)
        kseq, vseq = _sequence_order(s, kg, vg)
        out, lse = _gather_forward(s, q, kseq, vseq)
        return out, lse, kseq, vseq
    out, lse, blocks = _ring_forward(s, q, k, v, ring)
    return (out, lse, *[t for b in blocks[1:] for t in b])


def _backward(s: _Step, saved: list[torch.Tensor], ring: Ring | None,
              gather: bool) -> tuple[torch.Tensor, ...]:
    """``(dq, dk, dv)`` from ``[dout, *saved tensors]`` (the layout :func:`_forward` saved)."""
    if gather:
        dout, q, kseq, vseq, out, lse = saved
        dq, dkg, dvg = _gather_backward(s, dout, q, kseq, vseq, out, lse)
        # The cross-rank sum travels in the input dtype (half the bytes of float32), as the
        # P2P ring's dK/dV do.
        return (dq, reduce_scatter_tokens(dkg, s.cfg.group),
                reduce_scatter_tokens(dvg, s.cfg.group))
    dout, q, out, lse, *flat = saved
    blocks = [flat[i : i + 2] for i in range(0, len(flat), 2)]
    if len(blocks) == len(s.calls):
        return _saved_kv_backward(s, dout, q, blocks, out, lse, ring)
    k0, v0 = blocks[0]
    return _ring_backward(s, dout, q, k0, v0, out, lse, ring)


class _CPAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, meta: PackedBatch, cfg: CPConfig):
        distributed = dist.is_available() and dist.is_initialized() and meta.cp_size > 1
        rank = dist.get_rank(cfg.group) if distributed else 0
        step = _Step(
            cfg, meta, rank, meta.calls_for(cfg.comm, cfg.causal, rank),
            get_backend(q.device, cfg.backend),
            cfg.softmax_scale if cfg.softmax_scale is not None else q.shape[-1] ** -0.5,
        )
        ring = Ring(cfg.group) if distributed else None
        # At cp = 1 the all-gather plan is the ring's one local call: no gather, no way back.
        gather = cfg.comm == "all_gather" and meta.cp_size > 1
        if cfg.graphs:
            # Static graph outputs are overwritten by the next replay (another layer of the
            # same layout): what outlives this call is cloned out of them.
            res = [t.clone() for t in GRAPHS.run(
                _layout(step, "fwd", ring),
                lambda xs: _forward(step, xs[0], xs[1], xs[2], ring, gather),
                [q, k, v])]
            out, lse, rest = res[0], res[1], res[2:]
        else:
            out, lse, *rest = _forward(step, q, k, v, ring, gather)
        if gather:
            ctx.save_for_backward(q, *rest, out, lse)
        else:
            remote = rest if cfg.save_remote_kv else []
            ctx.save_for_backward(q, out, lse, k, v, *remote)
        ctx.step, ctx.ring, ctx.distributed = step, ring, distributed
        return out

    @staticmethod
    def backward(ctx, dout):
        step: _Step = ctx.step
        dout = dout.contiguous()
        gather = step.cfg.comm == "all_gather" and step.meta.cp_size > 1
        saved = [dout, *ctx.saved_tensors]
        if step.cfg.graphs:
            dq, dk, dv = (t.clone() for t in GRAPHS.run(
                _layout(step, "bwd", ctx.ring, len(saved)),
                lambda xs: _backward(step, xs, ctx.ring, gather), saved))
        else:
            dq, dk, dv = _backward(step, saved, ctx.ring, gather)
        if step.cfg.broken_always_zero_fill:
            zero_fill_padding([dq, dk, dv], step.meta, step.rank)
        return dq, dk, dv, None, None


def rank_local_work(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    meta: PackedBatch,
    rank: int,
    ring: LoopbackRing | LoopbackGather | None,
    *,
    causal: bool = True,
    softmax_scale: float | None = None,
    backend: str | None = None,
    tuning: Tuning = Tuning(),
    graphs: StepGraphs | None = None,
    comm: str = "p2p",
) -> tuple[torch.Tensor, ...]:
    """One rank's forward + backward on one device, remote data local.

    Exactly the kernels, merges and corrections ``cp_attn`` launches on ``rank`` (without
    autograd), with the network replaced by local tensors: the per-rank compute floor
    (``benchmarks/cp_attention_bench.py --floor``). ``comm="p2p"`` (saved-KV ring): a
    :class:`~cp_attention.ring.LoopbackRing` hands over the other ranks' KV blocks and dK/dV
    contributions; ``comm="all_gather"``: a :class:`~cp_attention.ring.LoopbackGather` hands
    over the gathered K/V and the other ranks' dK/dV for our block (which this rank then
    adds: NCCL's reduce-scatter would). ``ring`` may be None when ``cp_size`` is 1.

    :param graphs: run the step as one CUDA graph from this cache, bound to these tensors
        (``q``, ``k``, ``v``, ``dout`` and the ring's): the same tensors replay it with no
        copy; the outputs are the graph's, overwritten by its next replay.
    :returns: ``(out, lse, dq, dk, dv)`` of this rank (dk/dv include what the ring handed in).
    """
    cfg = CPConfig(None, comm, causal, softmax_scale, backend=backend)
    step = _Step(
        cfg, meta, rank, meta.calls_for(comm, causal, rank), get_backend(q.device, backend),
        softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5, tuning,
    )
    gather = comm == "all_gather" and meta.cp_size > 1  # cp = 1: the ring's one local call
    if gather and ring is not None and not isinstance(ring, LoopbackGather):
        raise ValueError(f"comm='all_gather' needs a LoopbackGather, got {type(ring).__name__}")
    if comm == "p2p" and ring is not None and not isinstance(ring, LoopbackRing):
        raise ValueError(f"comm='p2p' needs a LoopbackRing, got {type(ring).__name__}")
    work = _local_gather_work if gather else _local_work
    if graphs is None:
        return work(step, q, k, v, dout, ring)
    cp = meta.cp_size
    loop_type = LoopbackGather if gather else LoopbackRing

    def run(xs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        loop = loop_type.from_tensors(rank, cp, xs[4:]) if ring is not None else None
        res = work(step, xs[0], xs[1], xs[2], xs[3], loop)
        sent = sorted(loop.sent, key=lambda item: item[1]) if loop is not None else []
        return (*res, *[t for tensors, _ in sent for t in tensors])

    extra = ring.tensors() if ring is not None else []
    outs = graphs.run(_layout(step, "local_work", None, ring is not None), run,
                      [q, k, v, dout, *extra], bind=True)
    if ring is not None:  # what the rank sends to the other owners, by owner
        owners = sorted(set(range(cp)) - {rank}) if gather else \
            sorted((rank - i) % cp for i in range(1, cp))
        ring.sent += [(list(outs[5 + 2 * i : 7 + 2 * i]), owner)
                      for i, owner in enumerate(owners)]
    return outs[:5]


def _local_work(s: _Step, q, k, v, dout, ring) -> tuple[torch.Tensor, ...]:
    out, lse, blocks = _ring_forward(s, q, k, v, ring)
    dq, dk, dv = _saved_kv_backward(s, dout, q, blocks, out, lse, ring)
    return out, lse, dq, dk, dv


def _local_gather_work(s: _Step, q, k, v, dout, loop) -> tuple[torch.Tensor, ...]:
    kg, vg = loop.all_gather() if loop is not None else (k, v)
    kseq, vseq = _sequence_order(s, kg, vg)
    out, lse = _gather_forward(s, q, kseq, vseq)
    dq, dkg, dvg = _gather_backward(s, dout, q, kseq, vseq, out, lse)
    if loop is None:
        return out, lse, dq, dkg, dvg
    with phase("grad_reduce"):
        dk, dv = (sum_parts([(t, None, None) for t in parts], like, s.fused)
                  for parts, like in zip(loop.reduce_scatter([dkg, dvg]), (k, v), strict=True))
    return out, lse, dq, dk, dv


def cp_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: PackedBatch,
    *,
    group: dist.ProcessGroup | None = None,
    comm: str = "p2p",
    causal: bool = True,
    softmax_scale: float | None = None,
    broken_identity_padding: bool = False,
    broken_always_zero_fill: bool = False,
    backend: str | None = None,
    save_remote_kv: bool = True,
    graphs: bool = False,
) -> torch.Tensor:
    """Attention of this rank's local THD queries over the whole packed batch.

    :param q: local queries ``[meta.local_tokens, heads, dim]`` (from ``partition_for_rank``).
    :param k: local keys ``[meta.local_tokens, kv_heads, dim]``; ``kv_heads`` divides ``heads``.
    :param meta: the batch's :class:`PackedBatch`, already on ``q``'s device.
    :param group: the CP process group (size ``meta.cp_size``); None means the default group.
    :param comm: ``"p2p"`` (ring) or ``"all_gather"``.
    :param broken_identity_padding: reproduce TE's per-step device metadata (A/B runs only).
    :param broken_always_zero_fill: reproduce TE's unconditional gradient zero-fill.
    :param backend: local kernel (``math``, ``flash``, ``cudnn``); default picks per device.
    :param save_remote_kv: P2P only: keep received KV blocks for backward (faster, uses
        ``cp-1`` extra local KV blocks of memory); False runs the backward KV ring instead.
    :param graphs: replay forward and backward from CUDA graphs captured once per layout
        (:data:`GRAPHS`; inputs are copied into the graph's buffers and results cloned out
        of them, so any tensors of the layout's shapes work); a layout whose capture fails
        runs eagerly after one WARNING line. Inside the caller's own graph capture the step
        runs eagerly (it is capturable: no host sync).
    :returns: the local output rows, padding rows zero.
    :raises ValueError: when shapes, devices or the group do not match the metadata.
    """
    cfg = CPConfig(group, comm, causal, softmax_scale, broken_identity_padding,
                   broken_always_zero_fill, backend, save_remote_kv, graphs)
    _validate(q, k, v, meta, cfg)
    return _CPAttention.apply(q, k, v, meta, cfg)


def _validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: PackedBatch,
              cfg: CPConfig) -> None:
    """Fail before any collective starts, so a bad rank cannot leave the others waiting."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3 or t.shape[0] != meta.local_tokens:
            raise ValueError(
                f"{name} must be THD [{meta.local_tokens} local tokens, heads, dim], got "
                f"{tuple(t.shape)}; partition the packed batch with partition_for_rank"
            )
        if t.device != meta.device:
            raise ValueError(f"{name} is on {t.device} but the metadata is on {meta.device}; "
                             "call PackedBatch.to(device) once per batch")
    if k.shape != v.shape or q.shape[1] % k.shape[1]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must match, with heads "
                         f"dividing q's {q.shape[1]}")
    if meta.cp_size > 1:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(f"cp_size={meta.cp_size} needs an initialized process group")
        size = dist.get_world_size(cfg.group)
        if size != meta.cp_size:
            raise ValueError(f"the process group has {size} ranks but meta.cp_size={meta.cp_size}")
