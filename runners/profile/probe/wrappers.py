"""The functions the probe wraps and what it reads from each call.

* TE ``DotProductAttention.forward``: qkv_format, attn_mask_type, CP size/comm/strategy (from
  the module's ``set_context_parallel_group`` attributes), ``pad_between_seqs`` as passed and as
  TE resolved it (read from the ``AttentionParams`` TE builds inside the call), identity and
  value equality of ``cu_seqlens_*_padded`` vs ``cu_seqlens_*``, token counts, the FP8 recipe.
* TE ``set_context_parallel_group`` and ``get_batch_on_this_cp_rank``: each call recorded.
* ``cp_attention.cp_attn``: the same facts from its ``PackedBatch`` (host values, no sync).
* FSDP: ``FullyShardedDataParallel.__init__`` and ``fully_shard`` (which wrapping is in use).

Value equality needs the offsets on the host: the copy is taken at *sampled* calls only (one
small device-to-host copy, which synchronises that one call); unsampled calls cost a counter.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from runners.profile.probe.hooks import rebind, when_imported
from runners.profile.probe.record import CallFacts, ProbeState

TE_DPA_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"
TE_UTILS_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.utils"
TE_CP_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.context_parallel"
CP_ATTN_MODULE = "cp_attention.attention"
FSDP_MODULE = "torch.distributed.fsdp"
REBIND_PREFIXES = ("__main__", "cp_attention", "runners", "transformer_engine", "megatron", "nemo")

T = TypeVar("T")
DPA_SITE = "transformer_engine.DotProductAttention.forward"
CP_ATTN_SITE = "cp_attention.cp_attn"
GET_BATCH_SITE = "transformer_engine.get_batch_on_this_cp_rank"

# Inside a sampled DPA call: the list TE's resolved pad_between_seqs values are appended to.
_RESOLVED: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "cptrace_probe_resolved", default=None
)
# Inside any DPA call: TE re-enters forward for THD mask policies; count the outer call only.
_IN_DPA: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "cptrace_probe_in_dpa", default=False
)


def _host_list(t: Any) -> list[int] | None:
    if t is None:
        return None
    return [int(x) for x in (t.tolist() if hasattr(t, "tolist") else t)]


def _group_size(group: Any) -> int:
    if group is None:
        return 1
    import torch.distributed as dist

    if isinstance(group, list | tuple):
        size = 1
        for g in group:
            size *= dist.get_world_size(g)
        return size
    return int(dist.get_world_size(group))


def fp8_recipe_in_force() -> str | None:
    """The FP8 recipe class in force (``"off"`` outside fp8_autocast); None without TE."""
    import sys

    for name in ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8"):
        module = sys.modules.get(name)
        manager = getattr(module, "FP8GlobalStateManager", None)
        if manager is None:
            continue
        if not manager.is_fp8_enabled():
            return "off"
        recipe = manager.get_fp8_recipe()
        return type(recipe).__name__
    return None


def _guarded(state: ProbeState, site: str, fn: Callable[[], T]) -> T | None:
    """Run the probe's own bookkeeping; a failure is recorded, never raised into the job."""
    try:
        return fn()
    except Exception as exc:  # the job must not fail because the probe misread a call
        state.error(site, exc)
        return None


def _first_tensor(a: dict[str, Any], *names: str) -> Any:
    for name in names:
        value = a.get(name)
        if value is not None and hasattr(value, "shape"):
            return value
    return None


def _dpa_facts(
    state: ProbeState, self: Any, a: dict[str, Any]
) -> tuple[dict[str, Any], CallFacts]:
    """Signature and facts of one sampled ``DotProductAttention.forward`` call."""
    cu_q, cu_kv = a.get("cu_seqlens_q"), a.get("cu_seqlens_kv")
    cu_qp, cu_kvp = a.get("cu_seqlens_q_padded"), a.get("cu_seqlens_kv_padded")
    cp_size = _group_size(getattr(self, "cp_group", None))
    sig = {
        "qkv_format": a.get("qkv_format") or getattr(self, "qkv_format", None),
        "attn_mask_type": a.get("attn_mask_type") or getattr(self, "attn_mask_type", None),
        "cp_size": cp_size,
        "cp_comm_type": getattr(self, "cp_comm_type", None) if cp_size > 1 else None,
        "load_balancing_strategy": (
            getattr(self, "load_balancing_strategy", None) if cp_size > 1 else None
        ),
    }
    t0 = time.perf_counter_ns()
    q_list, qp_list = _host_list(cu_q), _host_list(cu_qp)
    kv_list, kvp_list = _host_list(cu_kv), _host_list(cu_kvp)
    state.host_copy_ns += time.perf_counter_ns() - t0
    same = None
    equal = None
    if cu_q is not None:
        same = (cu_qp is cu_q or cu_qp is None) and (cu_kvp is cu_kv or cu_kvp is None)
        equal = (qp_list is None or qp_list == q_list) and (
            kvp_list is None or kvp_list == kv_list
        )
    # TE 2.20 takes separate q/k/v or a packed qkv_layer; THD rows are tokens either way.
    rows = _first_tensor(a, "query_layer", "qkv_layer")
    facts = CallFacts(
        cu_seqlens=q_list,
        cu_seqlens_padded=qp_list if qp_list is not None else q_list,
        same_object=same,
        value_equal=equal,
        pad_between_seqs_passed=a.get("pad_between_seqs"),
        local_tokens=int(rows.shape[0]) if sig["qkv_format"] == "thd" and rows is not None
        else None,
        cp_size=cp_size,
        fp8_recipe=fp8_recipe_in_force(),
    )
    return sig, facts


def _wrap_dpa_forward(state: ProbeState, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)
    site = state.site(DPA_SITE)

    def record(sig: dict[str, Any], facts: CallFacts, resolved: list[bool]) -> None:
        facts.pad_between_seqs_resolved = resolved
        with state.lock:
            site.record(sig, facts)
        state.maybe_dump()

    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _IN_DPA.get():
            return original(self, *args, **kwargs)
        outer = _IN_DPA.set(True)
        try:
            if not site.tick():
                return original(self, *args, **kwargs)
            t0 = time.perf_counter_ns()
            seen = _guarded(
                state, DPA_SITE,
                lambda: _dpa_facts(state, self, signature.bind(self, *args, **kwargs).arguments),
            )
            state.overhead_ns += time.perf_counter_ns() - t0
            if seen is None:
                return original(self, *args, **kwargs)
            resolved: list[bool] = []
            token = _RESOLVED.set(resolved)
            try:
                return original(self, *args, **kwargs)
            finally:
                _RESOLVED.reset(token)
                t1 = time.perf_counter_ns()
                _guarded(state, DPA_SITE, lambda: record(*seen, resolved))
                state.overhead_ns += time.perf_counter_ns() - t1
        finally:
            _IN_DPA.reset(outer)

    forward.__cptrace_probe__ = True  # type: ignore[attr-defined]
    return forward


def _wrap_attention_params_init(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        sink = _RESOLVED.get()
        if sink is not None:
            sink.append(bool(getattr(self, "pad_between_seqs", False)))

    __init__.__cptrace_probe__ = True  # type: ignore[attr-defined]
    return __init__


def _wrap_set_cp_group(state: ProbeState, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def note(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        a = signature.bind(self, *args, **kwargs)
        a.apply_defaults()
        args_ = a.arguments
        state.event(
        "set_context_parallel_group",
        {
            "module": type(self).__name__,
            "cp_size": _group_size(args_.get("cp_group")),
            "cp_comm_type": args_.get("cp_comm_type"),
            "load_balancing_strategy": str(
                getattr(args_.get("load_balancing_strategy"), "value", None)
            ),
        },
        )

    @functools.wraps(original)
    def set_context_parallel_group(self: Any, *args: Any, **kwargs: Any) -> Any:
        _guarded(state, "set_context_parallel_group", lambda: note(self, args, kwargs))
        return original(self, *args, **kwargs)

    set_context_parallel_group.__cptrace_probe__ = True  # type: ignore[attr-defined]
    return set_context_parallel_group


def _wrap_get_batch(state: ProbeState, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)
    site = state.site(GET_BATCH_SITE)

    def note(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        a = signature.bind(*args, **kwargs)
        a.apply_defaults()
        args_ = a.arguments
        cp_size = _group_size(args_.get("cp_group"))
        t0 = time.perf_counter_ns()
        padded = _host_list(args_.get("cu_seqlens_padded"))
        state.host_copy_ns += time.perf_counter_ns() - t0
        with state.lock:
            site.record(
                {
                    "qkv_format": args_.get("qvk_format"),
                    "cp_size": cp_size,
                    "load_balancing_strategy": args_.get("load_balancing_strategy"),
                },
                CallFacts(cu_seqlens_padded=padded, cp_size=cp_size),
            )

    @functools.wraps(original)
    def get_batch_on_this_cp_rank(*args: Any, **kwargs: Any) -> Any:
        if site.tick():
            t0 = time.perf_counter_ns()
            _guarded(state, GET_BATCH_SITE, lambda: note(args, kwargs))
            state.overhead_ns += time.perf_counter_ns() - t0
        return original(*args, **kwargs)

    get_batch_on_this_cp_rank.__cptrace_probe__ = True  # type: ignore[attr-defined]
    return get_batch_on_this_cp_rank


def _wrap_cp_attn(state: ProbeState, original: Callable[..., Any]) -> Callable[..., Any]:
    site = state.site(CP_ATTN_SITE)

    def note(q: Any, meta: Any, kwargs: dict[str, Any]) -> None:
        cu, cup = list(meta.cu_seqlens), list(meta.cu_seqlens_padded)
        causal = kwargs.get("causal", True)
        sig = {
            "qkv_format": "thd",
            "attn_mask_type": "padding_causal" if causal else "padding",
            "cp_size": meta.cp_size,
            "cp_comm_type": kwargs.get("comm", "p2p") if meta.cp_size > 1 else None,
            "load_balancing_strategy": meta.strategy if meta.cp_size > 1 else None,
            "broken_identity_padding": bool(kwargs.get("broken_identity_padding", False)),
        }
        facts = CallFacts(
            cu_seqlens=cu,
            cu_seqlens_padded=cup,
            same_object=None,  # cp_attn takes a PackedBatch: it decides from values
            value_equal=cu == cup,
            pad_between_seqs_passed=None,
            pad_between_seqs_resolved=[bool(meta.has_padding)],
            local_tokens=int(q.shape[0]),
            cp_size=meta.cp_size,
            fp8_recipe=fp8_recipe_in_force(),
        )
        with state.lock:
            site.record(sig, facts)
        state.maybe_dump()

    @functools.wraps(original)
    def cp_attn(q: Any, k: Any, v: Any, meta: Any, **kwargs: Any) -> Any:
        if site.tick():
            t0 = time.perf_counter_ns()
            _guarded(state, CP_ATTN_SITE, lambda: note(q, meta, kwargs))
            state.overhead_ns += time.perf_counter_ns() - t0
        return original(q, k, v, meta, **kwargs)

    cp_attn.__cptrace_probe__ = True  # type: ignore[attr-defined]
    return cp_attn


def _wrap_fsdp_init(state: ProbeState, original: Callable[..., Any], kind: str) -> Callable:
    def note(args: tuple[Any, ...]) -> None:
        module = args[1] if kind == "FullyShardedDataParallel" else (args[0] if args else None)
        state.event("fsdp", {"kind": kind, "module": type(module).__name__})

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _guarded(state, "fsdp", lambda: note(args))
        return original(*args, **kwargs)

    wrapped.__cptrace_probe__ = True  # type: ignore[attr-defined]
    return wrapped


def _patched(obj: Any) -> bool:
    return bool(getattr(obj, "__cptrace_probe__", False))


def _patch_dpa(state: ProbeState, module: ModuleType) -> None:
    cls = getattr(module, "DotProductAttention", None)
    if cls is None:
        return
    if not _patched(cls.forward):
        cls.forward = _wrap_dpa_forward(state, cls.forward)
        state.installed.append(f"{module.__name__}:DotProductAttention.forward")
    if not _patched(cls.set_context_parallel_group):
        cls.set_context_parallel_group = _wrap_set_cp_group(state, cls.set_context_parallel_group)
        state.installed.append(f"{module.__name__}:DotProductAttention.set_context_parallel_group")


def _patch_utils(state: ProbeState, module: ModuleType) -> None:
    cls = getattr(module, "AttentionParams", None)
    if cls is not None and not _patched(cls.__init__):
        cls.__init__ = _wrap_attention_params_init(cls.__init__)
        state.installed.append(f"{module.__name__}:AttentionParams.__init__")


def _patch_function(
    state: ProbeState, module: ModuleType, name: str, wrap: Callable[..., Any]
) -> None:
    original = getattr(module, name, None)
    if original is None or _patched(original):
        return
    wrapped = wrap(state, original)
    setattr(module, name, wrapped)
    rebind(original, wrapped, prefixes=REBIND_PREFIXES)
    state.installed.append(f"{module.__name__}:{name}")


def _patch_fsdp(state: ProbeState, module: ModuleType) -> None:
    cls = getattr(module, "FullyShardedDataParallel", None)
    if cls is not None and not _patched(cls.__init__):
        cls.__init__ = _wrap_fsdp_init(state, cls.__init__, "FullyShardedDataParallel")
        state.installed.append(f"{module.__name__}:FullyShardedDataParallel.__init__")
    shard = getattr(module, "fully_shard", None)
    if shard is not None and not _patched(shard):
        wrapped = _wrap_fsdp_init(state, shard, "fully_shard")
        module.fully_shard = wrapped  # type: ignore[attr-defined]
        rebind(shard, wrapped, prefixes=("__main__", "runners", "torchtitan", "megatron"))
        state.installed.append(f"{module.__name__}:fully_shard")


def install_wrappers(state: ProbeState) -> None:
    """Patch every target now if imported, else right after its import."""
    when_imported(TE_DPA_MODULE, lambda m: _patch_dpa(state, m))
    when_imported(TE_UTILS_MODULE, lambda m: _patch_utils(state, m))
    when_imported(
        TE_CP_MODULE,
        lambda m: _patch_function(state, m, "get_batch_on_this_cp_rank", _wrap_get_batch),
    )
    when_imported(CP_ATTN_MODULE, lambda m: _patch_function(state, m, "cp_attn", _wrap_cp_attn))
    when_imported(FSDP_MODULE, lambda m: _patch_fsdp(state, m))
