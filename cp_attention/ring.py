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
