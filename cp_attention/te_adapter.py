"""A drop-in for Transformer Engine's ``DotProductAttention`` (THD, CP) with correct metadata.

TE >= 2.18 decides ``pad_between_seqs`` by object identity when it is left as None, so a
value-equal clone of ``cu_seqlens`` takes the padded path: per-step device metadata
(``get_cu_seqlens_on_cp_rank``) and gradient zero-fill (DESIGN problem 1). The opposite mistake,
claiming "no padding" for a tail-padded pack, is a correctness bug (TE issue #3331). The adapter
decides from values held on the host by a :class:`~cp_attention.PackedBatch`:

* no padding: pass ONE tensor object for padded and unpadded ``cu_seqlens`` and
  ``pad_between_seqs=False``, so TE skips the per-step metadata (``get_cu_seqlens_on_cp_rank``);
* padding (the last entry included): pass the padded offsets and ``pad_between_seqs=True``.

What the adapter cannot remove: TE 2.20's P2P backward zero-fills THD gradient padding on every
call (``AttnFuncWithCPAndKVP2P.backward`` calls ``_zero_thd_padding`` unconditionally, and
``FusedAttention`` replaces a missing ``cu_seqlens_*_padded`` by ``cu_seqlens_*`` first), so no
argument reaches it; measured on the reference workload: 92 launches and ~0.72 ms of GPU time per
step per rank. The bundled :func:`cp_attention.cp_attn` zero-fills only when padding exists.

This module imports without TE; constructing the adapter without TE raises
:class:`TransformerEngineUnavailable` (an ``ImportError``).
"""

from __future__ import annotations

from typing import Any

import torch

from cp_attention.metadata import PackedBatch, has_padding_by_value


class TransformerEngineUnavailable(ImportError):
    """transformer_engine is not installed (or failed to import) on this host."""


def _te_dot_product_attention() -> type:
    try:
        from transformer_engine.pytorch import DotProductAttention
    except Exception as exc:
        raise TransformerEngineUnavailable(
            "AdaptedDotProductAttention needs transformer_engine[pytorch] >= 2.18 "
            f"(pip install 'cptrace[te]'); importing it failed: {exc}"
        ) from exc
    return DotProductAttention


class AdaptedDotProductAttention(torch.nn.Module):
    """TE ``DotProductAttention`` whose THD padding metadata is decided from values.

    Constructor arguments are TE's (``num_attention_heads``, ``kv_channels``, ``qkv_format="thd"``,
    ``attn_mask_type``, ``cp_group``, ``cp_global_ranks``, ``cp_stream``, ``cp_comm_type``...).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.inner = _te_dot_product_attention()(*args, **kwargs)

    def set_context_parallel_group(self, *args: Any, **kwargs: Any) -> None:
        """Forwarded to TE unchanged."""
        self.inner.set_context_parallel_group(*args, **kwargs)

    def forward(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        *,
        packed_batch: PackedBatch | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """TE's forward with ``cu_seqlens*`` and ``pad_between_seqs`` filled in correctly.

        With ``packed_batch`` (recommended) the decision costs nothing on the device. Without it,
        the caller's ``cu_seqlens_q``/``cu_seqlens_q_padded`` (and KV) values are compared,
        which reads them to the host once per call.
        """
        if packed_batch is not None:
            kwargs.update(te_thd_kwargs(packed_batch))
        else:
            kwargs.update(_decide_from_tensors(kwargs))
        return self.inner(query_layer, key_layer, value_layer, **kwargs)


def te_thd_kwargs(meta: PackedBatch) -> dict[str, Any]:
    """TE forward arguments for a packed batch (tensors on the batch's device)."""
    cu = meta.cu_seqlens_tensor
    padded = meta.cu_seqlens_padded_tensor if meta.has_padding else cu
    return {
        "cu_seqlens_q": cu,
        "cu_seqlens_kv": cu,
        # Same object when equal: TE's identity check then agrees with the values.
        "cu_seqlens_q_padded": padded,
        "cu_seqlens_kv_padded": padded,
        "max_seqlen_q": meta.max_seqlen_padded,
        "max_seqlen_kv": meta.max_seqlen_padded,
        "pad_between_seqs": meta.has_padding,
    }


def _decide_from_tensors(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Value-based decision for callers that only have TE-style tensors."""
    updates: dict[str, Any] = {}
    padded_any = False
    for side in ("q", "kv"):
        cu = kwargs.get(f"cu_seqlens_{side}")
        padded = kwargs.get(f"cu_seqlens_{side}_padded")
        if cu is None or padded is None:
            continue
        if has_padding_by_value(cu.cpu(), padded.cpu()):
            padded_any = True
        else:
            updates[f"cu_seqlens_{side}_padded"] = cu
    if kwargs.get("pad_between_seqs") is None:
        updates["pad_between_seqs"] = padded_any
    return updates
