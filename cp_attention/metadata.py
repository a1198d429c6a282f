"""Packed-batch metadata, built once per batch on the host from values.

This is the fix for DESIGN problem 1. Whether a batch has padding between sequences is decided
from the *values* of ``cu_seqlens`` and ``cu_seqlens_padded``, every entry including the last
(a tail-padded sequence whose length is not divisible by ``2*cp`` differs only in the last
entries: TE issue #3331), never from object identity. Everything the CP step needs (partition
indices, per-step ``cu_seqlens`` for Q and KV, max lengths as Python ints) is computed here with
numpy, moved to the device once with :meth:`PackedBatch.to` (one copy per dtype), and never
read back: the hot loop launches no metadata kernels and performs no device-to-host sync, so it
is CUDA-graph safe.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from cp_attention.partition import (
    STRATEGIES,
    as_offsets,
    dual_chunk_swap_index,
    no_load_balance_bounds,
)
from cp_attention.plan import (
    COMMS,
    AttnCall,
    GatherOrder,
    Geometry,
    JointBwd,
    gather_calls,
    joint_bwd_plan,
    p2p_calls,
)
from cp_attention.ranges import phase
from cp_attention.transfer import to_device_packed

Offsets = Sequence[int] | torch.Tensor


def has_padding_by_value(cu_seqlens: Offsets, cu_seqlens_padded: Offsets) -> bool:
    """True when any entry differs, the last one included (the correct detector)."""
    cu = as_offsets(cu_seqlens, "cu_seqlens")
    cup = as_offsets(cu_seqlens_padded, "cu_seqlens_padded")
    return cu.shape != cup.shape or bool((cu != cup).any())


def has_padding_by_identity(cu_seqlens: object, cu_seqlens_padded: object) -> bool:
    """TE >= 2.18's detector, kept only to reproduce it: value-equal clones count as padded."""
    return cu_seqlens_padded is not None and cu_seqlens_padded is not cu_seqlens


@dataclass(frozen=True)
class PackedBatch:
    """Everything CP attention needs about one packed batch, immutable after construction.

    Build with :meth:`from_cu_seqlens`; move with :meth:`to` once per batch.
    """

    cu_seqlens: tuple[int, ...]
    cu_seqlens_padded: tuple[int, ...]
    cp_size: int
    strategy: str
    has_padding: bool
    #: Some token of the packed buffer is padding, so its gradient must be zero.
    has_grad_tail: bool
    max_seqlen: int
    max_seqlen_padded: int
    total_tokens: int
    local_tokens: int
    #: Per rank: global token index (DualChunkSwap) or ``(start, stop)`` block (NoLoadBalance).
    partition: tuple[torch.Tensor | tuple[int, int], ...]
    #: ``(comm, causal, rank) -> calls``; P2P has one entry per ring step, all-gather one
    #: or two calls over the gathered KV in sequence order (:attr:`gather`).
    calls: dict[tuple[str, bool, int], tuple[AttnCall | None, ...]] = field(repr=False)
    #: Device copies of the offsets, used only by the TE-style A/B path.
    cu_seqlens_tensor: torch.Tensor = field(repr=False)
    cu_seqlens_padded_tensor: torch.Tensor = field(repr=False)
    #: ``(causal, rank) -> JointBwd`` for the ranks whose P2P backward is one call.
    joint: dict[tuple[bool, int], JointBwd] = field(default_factory=dict, repr=False)
    #: ``(causal, rank) -> GatherOrder``: the all-gather calls' KV order and dK/dV way back.
    gather: dict[tuple[bool, int], GatherOrder] = field(default_factory=dict, repr=False)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @classmethod
    def from_cu_seqlens(
        cls,
        cu_seqlens: Offsets,
        cu_seqlens_padded: Offsets | None = None,
        *,
        cp_size: int,
        strategy: str = "dual_chunk_swap",
        device: torch.device | str | None = None,
    ) -> PackedBatch:
        """Validate the offsets and plan every rank and step.

        :param cu_seqlens: real cumulative sequence lengths (list or CPU tensor).
        :param cu_seqlens_padded: padded offsets; None means no padding.
        :raises ValueError: with the offending field, value and what was expected.
        """
        with phase("metadata"):
            if strategy not in STRATEGIES:
                raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
            if not isinstance(cp_size, int) or cp_size < 1:
                raise ValueError(f"cp_size must be a positive int, got {cp_size!r}")
            cu = as_offsets(cu_seqlens, "cu_seqlens")
            cup = (cu if cu_seqlens_padded is None
                   else as_offsets(cu_seqlens_padded, "cu_seqlens_padded"))
            real_len = _check_lengths(cu, cup)
            _check_divisible(cup, cp_size, strategy)
            total = int(cup[-1])
            geom = Geometry(cup, real_len, cp_size, strategy, total // cp_size)
            padded = bool(cu.shape != cup.shape or (cu != cup).any())
            partition = _partitions(cup, cp_size, strategy)
            calls, gather = _all_calls(geom, partition)
            meta = cls(
                cu_seqlens=tuple(cu.tolist()),
                cu_seqlens_padded=tuple(cup.tolist()),
                cp_size=cp_size,
                strategy=strategy,
                has_padding=padded,
                has_grad_tail=bool((real_len < np.diff(cup)).any()),
                max_seqlen=int(real_len.max()),
                max_seqlen_padded=int(np.diff(cup).max()),
                total_tokens=total,
                local_tokens=total // cp_size,
                partition=partition,
                calls=calls,
                cu_seqlens_tensor=torch.from_numpy(cu.astype(np.int32)),
                cu_seqlens_padded_tensor=torch.from_numpy(cup.astype(np.int32)),
                joint=_joint_plans(geom),
                gather=gather,
            )
        return meta if device is None else meta.to(device)

    def to(self, device: torch.device | str) -> PackedBatch:
        """A copy whose tensors live on ``device``: one host-to-device copy per dtype.

        Every tensor leaf (partition indices, each planned call's row indices and offsets, the
        offsets for the TE path) is packed into one buffer per dtype (int32 and int64: two
        copies) instead of ~40 tiny copies; the new batch holds views of the device buffers.
        The copies are asynchronous and nothing is read back (no device-to-host sync).
        """
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        with phase("metadata"):
            leaves = iter(to_device_packed(self._tensors(), dev))
            # Rebuilt in exactly the order _tensors() listed the leaves.
            partition = tuple(p if isinstance(p, tuple) else next(leaves) for p in self.partition)
            calls = {
                key: tuple(c if c is None else c.with_tensors(leaves) for c in calls)
                for key, calls in self.calls.items()
            }
            cu, cu_padded = next(leaves), next(leaves)
            joint = {key: plan.with_tensors(leaves) for key, plan in self.joint.items()}
            gather = {key: order.with_tensors(leaves) for key, order in self.gather.items()}
        return replace(
            self,
            partition=partition,
            calls=calls,
            joint=joint,
            gather=gather,
            cu_seqlens_tensor=cu,
            cu_seqlens_padded_tensor=cu_padded,
            device=dev,
        )

    def _tensors(self) -> list[torch.Tensor]:
        """Every tensor leaf, in a fixed order: partition, calls (dict order), offsets."""
        leaves = [p for p in self.partition if isinstance(p, torch.Tensor)]
        for calls in self.calls.values():
            for call in calls:
                if call is not None:
                    leaves.extend(call.tensors())
        leaves += [self.cu_seqlens_tensor, self.cu_seqlens_padded_tensor]
        for plan in self.joint.values():
            leaves.extend(plan.tensors())
        for order in self.gather.values():
            leaves.extend(order.tensors())
        return leaves

    def calls_for(self, comm: str, causal: bool, rank: int) -> tuple[AttnCall | None, ...]:
        """The planned kernel calls of ``rank``.

        :raises ValueError: for an unknown comm or a rank outside the CP group.
        """
        if comm not in COMMS:
            raise ValueError(f"comm must be one of {COMMS}, got {comm!r}")
        if not 0 <= rank < self.cp_size:
            raise ValueError(f"rank must be in [0, {self.cp_size}), got {rank}")
        return self.calls[(comm, bool(causal), rank)]

    def gather_order(self, causal: bool, rank: int) -> GatherOrder:
        """How ``rank``'s all-gather calls read the gathered KV and return its dK/dV."""
        return self.gather[(bool(causal), rank)]

    def joint_bwd(self, causal: bool, rank: int) -> JointBwd | None:
        """The one-call P2P backward of ``rank`` (:class:`~cp_attention.plan.JointBwd`), if any."""
        return self.joint.get((bool(causal), rank))

    @property
    def real_lengths(self) -> tuple[int, ...]:
        """Real length of every sequence."""
        cu = self.cu_seqlens
        return tuple(b - a for a, b in itertools.pairwise(cu))


def _check_lengths(cu: np.ndarray, cup: np.ndarray) -> np.ndarray:
    """Real lengths, after checking they fit in their padded slots."""
    if cu.shape != cup.shape:
        raise ValueError(
            f"cu_seqlens has {cu.size} entries but cu_seqlens_padded has {cup.size}; "
            "expected one entry per sequence plus one"
        )
    real_len, padded_len = np.diff(cu), np.diff(cup)
    over = np.flatnonzero(real_len > padded_len)
    if over.size:
        i = int(over[0])
        raise ValueError(
            f"sequence {i} has real length {int(real_len[i])} but padded length "
            f"{int(padded_len[i])}; expected cu_seqlens_padded to leave room for every sequence"
        )
    if cup[-1] == 0:
        raise ValueError("the packed batch is empty (cu_seqlens_padded[-1] == 0)")
    return real_len


def _check_divisible(cup: np.ndarray, cp_size: int, strategy: str) -> None:
    """Each strategy's divisibility rule, with the fix in the message."""
    if strategy == "dual_chunk_swap":
        padded_len = np.diff(cup)
        bad = np.flatnonzero(padded_len % (2 * cp_size))
        if bad.size:
            shown = ", ".join(f"#{i}={int(padded_len[i])}" for i in bad[:5])
            raise ValueError(
                f"dual_chunk_swap needs every padded sequence length divisible by 2*cp="
                f"{2 * cp_size}; not divisible: {shown}. Build cu_seqlens_padded with "
                f"pad_sequences_to_multiple(cu_seqlens, {2 * cp_size}) or use no_load_balance"
            )
    elif cup[-1] % cp_size:
        raise ValueError(
            f"no_load_balance needs the token count ({int(cup[-1])}) divisible by cp={cp_size}; "
            "pad the batch with pad_to_multiple"
        )


def _partitions(
    cup: np.ndarray, cp_size: int, strategy: str
) -> tuple[torch.Tensor | tuple[int, int], ...]:
    """Per-rank token selection for inputs and labels."""
    if strategy == "no_load_balance":
        return tuple(no_load_balance_bounds(int(cup[-1]), cp_size, r) for r in range(cp_size))
    return tuple(torch.from_numpy(dual_chunk_swap_index(cup, cp_size, r)) for r in range(cp_size))


def _all_calls(
    geom: Geometry, partition: tuple[torch.Tensor | tuple[int, int], ...]
) -> tuple[dict[tuple[str, bool, int], tuple[AttnCall | None, ...]],
           dict[tuple[bool, int], GatherOrder]]:
    """Plan both comms, causal and not, for every rank (cheap: numpy over sequences)."""
    owner_rows = np.concatenate([np.arange(*p) if isinstance(p, tuple) else p.numpy()
                                 for p in partition]).astype(np.int64)
    calls: dict[tuple[str, bool, int], tuple[AttnCall | None, ...]] = {}
    gather: dict[tuple[bool, int], GatherOrder] = {}
    for rank in range(geom.cp_size):
        for causal in (False, True):
            calls[("p2p", causal, rank)] = p2p_calls(geom, rank, causal)
            calls[("all_gather", causal, rank)], gather[(causal, rank)] = gather_calls(
                geom, rank, causal, owner_rows)
    return calls, gather


def _joint_plans(geom: Geometry) -> dict[tuple[bool, int], JointBwd]:
    """The ranks (and causal flags) whose P2P backward is one call."""
    plans = {}
    for rank in range(geom.cp_size):
        for causal in (False, True):
            plan = joint_bwd_plan(geom, rank, causal)
            if plan is not None:
                plans[(causal, rank)] = plan
    return plans
