"""Communication for CP attention: ring send/recv and all-gather / reduce-scatter.

P2P sends go through ``torch.distributed.batch_isend_irecv``. On NCCL the transfers run on
NCCL's own stream, so the next block arrives while the current block computes; ``wait()`` only
makes the compute stream wait (no host sync). On gloo (CPU tests) they run on gloo's threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cp_attention.ranges import phase


@dataclass
class Pending:
    """In-flight receives; :meth:`wait` returns the received tensors."""

    works: list[dist.Work]
    received: list[torch.Tensor]

    def wait(self) -> list[torch.Tensor]:
        """Make the current stream (NCCL) or thread (gloo) wait for the transfers."""
        with phase("comm_send_recv"):
            for work in self.works:
                work.wait()
        return self.received


class Ring:
    """Neighbours of this rank in a CP group: send to ``rank+1``, receive from ``rank-1``."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.next = _global_rank(group, (self.rank + 1) % self.size)
        self.prev = _global_rank(group, (self.rank - 1) % self.size)

    def exchange(self, send: Sequence[torch.Tensor], recv_like: Sequence[torch.Tensor]) -> Pending:
        """Send ``send`` to the next rank and receive tensors shaped like ``recv_like``.

        Sends are posted before receives, in list order, on every rank, so gloo's in-order tag
        matching pairs them correctly even when next == prev (cp=2).
        """
        with phase("comm_send_recv"):
            received = [torch.empty_like(t) for t in recv_like]
            ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in send]
            ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in received]
            works = dist.batch_isend_irecv(ops) if ops else []
        return Pending(list(works), received)


    def exchange_pairs(
        self,
        sends: list[tuple[list[torch.Tensor], int]],
        recvs: list[tuple[list[torch.Tensor], int]],
    ) -> Pending:
        """Send tensor lists to group ranks and receive lists shaped like the given ones.

        Every ordered pair of ranks exchanges at most one list, so gloo's in-order matching
        is unambiguous. Received tensors come back flattened in ``recvs`` order.
        """
        with phase("comm_send_recv"):
            ops, received = [], []
            for tensors, peer in sends:
                dst = _global_rank(self.group, peer)
                ops += [dist.P2POp(dist.isend, t.contiguous(), dst, self.group) for t in tensors]
            for like, peer in recvs:
                src = _global_rank(self.group, peer)
                bufs = [torch.empty_like(t) for t in like]
                received += bufs
                ops += [dist.P2POp(dist.irecv, t, src, self.group) for t in bufs]
            works = dist.batch_isend_irecv(ops) if ops else []
        return Pending(list(works), received)


def _global_rank(group: dist.ProcessGroup | None, group_rank: int) -> int:
    """P2POp wants global ranks."""
    if group is None or group is dist.GroupMember.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


def all_gather_tokens(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Concatenate every rank's ``x`` along tokens, in rank order."""
    size = dist.get_world_size(group)
    with phase("comm_all_gather"):
        if dist.get_backend(group) == "gloo":
            parts = [torch.empty_like(x) for _ in range(size)]
            dist.all_gather(parts, x.contiguous(), group=group)
            return torch.cat(parts)
        out = x.new_empty((size * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out


def reduce_scatter_tokens(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Sum ``x`` over ranks and keep this rank's token block (inverse of the all-gather)."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    block = x.shape[0] // size
    with phase("grad_reduce"):
        if dist.get_backend(group) == "gloo":
            # gloo has no reduce-scatter: all-reduce and keep our block.
            x = x.contiguous()
            dist.all_reduce(x, group=group)
            return x[rank * block : (rank + 1) * block].clone()
        out = x.new_empty((block, *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
        return out


class LoopbackRing:
    """A ring whose 'received' tensors are given up front: one device plays one rank.

    For the per-rank compute floor (:func:`cp_attention.attention.rank_local_work`): the P2P
    forward gets the other ranks' KV blocks in ring order and the saved-KV backward gets the
    dK/dV contributions of the other ranks to our block, all as local tensors, so the rank's
    own kernels run exactly as in a CP run with no transfer at all. The dK/dV this rank would
    send to the owners of remote blocks are kept in :attr:`sent` (``(tensors, owner)``), so a
    test can assemble the full result.
    """

    def __init__(self, rank: int, size: int, kv_blocks: Sequence[Sequence[torch.Tensor]],
                 dkv_from_peers: Sequence[Sequence[torch.Tensor]]) -> None:
        """:param kv_blocks: KV of ranks ``rank-1, rank-2, ...`` (ring order), ``size-1`` lists.
        :param dkv_from_peers: for ``i = 1 .. size-1``, the dK/dV rank ``rank+i`` sends us.
        """
        if len(kv_blocks) != size - 1 or len(dkv_from_peers) != size - 1:
            raise ValueError(f"a loopback ring of {size} ranks needs {size - 1} KV blocks and "
                             f"{size - 1} dK/dV pairs, got {len(kv_blocks)} and "
                             f"{len(dkv_from_peers)}")
        self.rank, self.size = rank, size
        self._kv = [list(b) for b in kv_blocks]
        self._dkv = [list(g) for g in dkv_from_peers]
        self._next_kv = 0
        self.sent: list[tuple[list[torch.Tensor], int]] = []

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor handed in (KV blocks, then dK/dV), flat, as :meth:`from_tensors`
        takes them."""
        return [t for block in (*self._kv, *self._dkv) for t in block]

    @classmethod
    def from_tensors(cls, rank: int, size: int, flat: Sequence[torch.Tensor]) -> LoopbackRing:
        """A ring over :meth:`tensors`' output (two tensors per block and per dK/dV pair)."""
        pairs = [list(flat[i : i + 2]) for i in range(0, len(flat), 2)]
        return cls(rank, size, pairs[: size - 1], pairs[size - 1 :])

    def exchange(self, send: Sequence[torch.Tensor], recv_like: Sequence[torch.Tensor]) -> Pending:
        """The next KV block of the ring (forward); ``send`` is what would leave."""
        with phase("comm_send_recv"):
            block = self._kv[self._next_kv % len(self._kv)]
            self._next_kv += 1
        return Pending([], block[: len(recv_like)])

    def exchange_pairs(self, sends: list[tuple[list[torch.Tensor], int]],
                       recvs: list[tuple[list[torch.Tensor], int]]) -> Pending:
        """The other ranks' dK/dV for our block (saved-KV backward), in ``recvs`` order."""
        with phase("comm_send_recv"):
            self.sent += [(list(t), peer) for t, peer in sends]
            received = [t for i in range(len(recvs)) for t in self._dkv[i]]
        return Pending([], received)


class LoopbackGather:
    """All-gather CP's collectives with their results given up front: one device, one rank.

    For the per-rank compute floor of the all-gather comm
    (:func:`cp_attention.attention.rank_local_work` with ``comm="all_gather"``): the forward
    gets the gathered K and V (every owner's block, in rank order) as local tensors, and the
    backward's reduce-scatter gets the other ranks' dK/dV for our block, so the rank's own
    kernels run as in a CP run with no transfer. The gathered dK/dV blocks this rank would
    contribute to other owners are kept in :attr:`sent` (``(tensors, owner)``).
    """

    def __init__(self, rank: int, size: int, gathered_kv: Sequence[torch.Tensor],
                 dkv_from_peers: Sequence[Sequence[torch.Tensor]]) -> None:
        """:param gathered_kv: ``[K, V]`` of all ranks, ``[size * local_tokens, ...]`` each.
        :param dkv_from_peers: the dK/dV for our block from each of the ``size-1`` others.
        """
        if len(gathered_kv) != 2 or len(dkv_from_peers) != size - 1:
            raise ValueError(f"a loopback all-gather of {size} ranks needs the gathered K and V "
                             f"and {size - 1} dK/dV pairs, got {len(gathered_kv)} tensors and "
                             f"{len(dkv_from_peers)} pairs")
        self.rank, self.size = rank, size
        self._kv = list(gathered_kv)
        self._dkv = [list(g) for g in dkv_from_peers]
        self.sent: list[tuple[list[torch.Tensor], int]] = []

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor handed in (K, V, then dK/dV), flat, as :meth:`from_tensors` takes them."""
        return [*self._kv, *[t for pair in self._dkv for t in pair]]

    @classmethod
    def from_tensors(cls, rank: int, size: int, flat: Sequence[torch.Tensor]) -> LoopbackGather:
        """A loopback over :meth:`tensors`' output."""
        pairs = [list(flat[i : i + 2]) for i in range(2, len(flat), 2)]
        return cls(rank, size, flat[:2], pairs)

    def all_gather(self) -> list[torch.Tensor]:
        """The gathered ``[K, V]``."""
        with phase("comm_all_gather"):
            return list(self._kv)

    def reduce_scatter(self, grads: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Per tensor of ``grads`` (gathered dK, dV): our block's parts to add (ours first,
        then each peer's); the other owners' blocks go to :attr:`sent`."""
        block = grads[0].shape[0] // self.size
        with phase("comm_send_recv"):
            for owner in range(self.size):
                if owner != self.rank:
                    self.sent.append(([g[owner * block : (owner + 1) * block] for g in grads],
                                      owner))
            return [[g[self.rank * block : (self.rank + 1) * block],
                     *[pair[t] for pair in self._dkv]] for t, g in enumerate(grads)]
