"""Workload specs: what a run executes, as YAML validated by pydantic.

One spec describes one launch: a CP attention workload (implementation, ranks, packed sequence
lengths, attention shape, how the packed metadata is passed) plus named *variants* that override
workload fields. All variants run interleaved (ABBA) in one process, so they share the allocator,
the inputs and the machine state; that is what makes their timings comparable.

Example (see ``runners/examples/`` for one per scenario)::

    name: te-reference-3arms
    implementation: te
    ranks: 2
    seqlens: [8192, 4096, 2048, 2048]
    heads: 16
    head_dim: 128
    variants:
      auto_clone: {metadata: value_equal_clone, pad_between_seqs: null}
      explicit_false: {metadata: value_equal_clone, pad_between_seqs: false}
      auto_same: {metadata: same_object, pad_between_seqs: null}

Why pydantic models with ``extra="forbid"``: a misspelled field (``pad_between_seq``) must fail
loudly, naming the field, instead of silently running the default.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from contracts.packing import PackedLayout, build_layout
from contracts.validation import first_error

Implementation = Literal["bundled", "te", "te_adapter"]
CPComm = Literal["p2p", "all_gather"]
Strategy = Literal["dual_chunk_swap", "no_load_balance"]
DType = Literal["bf16", "fp16", "fp32"]
MetadataPassing = Literal["same_object", "value_equal_clone", "real_padding"]
ProfilerMode = Literal["nsys", "torch", "both", "none"]
ModelKind = Literal["te_transformer", "torch_transformer"]
FP8Recipe = Literal["delayed", "current", "mxfp8", "blockwise"]
FSDPMode = Literal["none", "fsdp", "fully_shard"]

# Fields a variant may not override: they shape the launch itself (process count, profilers,
# how many iterations every arm gets), so they must be one value for the whole run.
RUN_LEVEL_FIELDS = frozenset(
    {"name", "ranks", "device", "warmup", "iterations", "profilers", "variants", "model",
     "watchdog_s"}
)


class SpecError(ValueError):
    """The spec file is unreadable or invalid; the message names the field and the reason."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SeqlenDistribution(_Strict):
    """Sequence lengths drawn from a seeded distribution (reproducible across hosts)."""

    count: int = Field(ge=1, le=65536)
    """How many sequences to pack."""
    min: int = Field(ge=1)
    """Shortest sequence length (tokens)."""
    max: int = Field(ge=1)
    """Longest sequence length (tokens)."""
    multiple_of: int = Field(default=1, ge=1)
    """Round every drawn length up to this multiple (e.g. ``2 * ranks`` for DualChunkSwap)."""
    distribution: Literal["uniform", "loguniform"] = "uniform"
    """Shape of the draw; ``loguniform`` gives many short and few long sequences."""
    seed: int = 0
    """Seed of the private RNG; the same seed gives the same lengths everywhere."""

    @model_validator(mode="after")
    def _check_range(self) -> SeqlenDistribution:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def draw(self) -> list[int]:
        """The lengths this distribution stands for (deterministic for a given seed)."""
        rng = random.Random(self.seed)
        lengths = []
        for _ in range(self.count):
            if self.distribution == "uniform":
                n = rng.randint(self.min, self.max)
            else:
                n = round(self.min * (self.max / self.min) ** rng.random())
            m = self.multiple_of
            lengths.append(-(-n // m) * m)
        return lengths


class TorchProfilerOptions(_Strict):
    """PyTorch profiler (Kineto) settings; one Chrome-trace JSON per rank, gzipped."""

    with_stack: bool = True
    """Record Python stacks, so TE helpers appear as Python frames the catalog can match."""
    record_shapes: bool = False
    """Record input shapes (larger traces)."""


class NsysOptions(_Strict):
    """Nsight Systems settings; one SQLite export for all ranks."""

    trace: str = "cuda,nvtx"
    """Value of ``nsys profile -t``."""
    python_functions_trace: bool = True
    """Generate ``--python-functions-trace`` from the helper catalog (TE helpers get ranges)."""
    extra_args: list[str] = Field(default_factory=list)
    """More ``nsys profile`` arguments, appended verbatim."""


class Profilers(_Strict):
    """Which profilers capture the profiled steps, and how many steps each arm gets."""

    mode: ProfilerMode = "torch"
    """``nsys``, ``torch``, ``both`` (two launches: profilers must not share CUPTI) or ``none``."""
    profiled_steps: int = Field(default=3, ge=1, le=100)
    """Steps per arm captured by the profiler, after the timed iterations."""
    torch: TorchProfilerOptions = Field(default_factory=TorchProfilerOptions)
    nsys: NsysOptions = Field(default_factory=NsysOptions)

    @property
    def uses_torch(self) -> bool:
        return self.mode in ("torch", "both")

    @property
    def uses_nsys(self) -> bool:
        return self.mode in ("nsys", "both")


class ModelSpec(_Strict):
    """A real model instead of attention alone (``runners/models/``): layers, optimizer step.

    Each step is forward + backward + optimizer step of a stack of transformer layers on the
    rank's CP partition of the packed batch; ``layers``, ``heads``, ``kv_heads``, ``head_dim``,
    ``dtype``, ``causal``, ``cp_comm`` and ``strategy`` come from the workload fields.
    """

    kind: ModelKind
    """``te_transformer`` (``te.TransformerLayer``, ``attn_input_format="thd"``, CUDA) or
    ``torch_transformer`` (torch layers around the bundled ``cp_attn``; CPU or CUDA)."""
    hidden: int | None = Field(default=None, ge=1)
    """Model width; None = ``heads * head_dim``."""
    ffn_hidden: int | None = Field(default=None, ge=1)
    """MLP width; None = ``4 * hidden``."""
    fp8: bool = False
    """Run the layers under ``te.fp8_autocast`` (te_transformer only)."""
    fp8_recipe: FP8Recipe = "delayed"
    """``delayed`` (DelayedScaling), ``current`` (Float8CurrentScaling), ``mxfp8``,
    ``blockwise``."""
    fsdp: FSDPMode = "none"
    """Shard parameters over the ranks: ``fsdp`` (FullyShardedDataParallel) or ``fully_shard``."""
    lr: float = Field(default=1e-4, gt=0)
    """AdamW learning rate."""

    @model_validator(mode="after")
    def _check_model(self) -> ModelSpec:
        if self.fp8 and self.kind != "te_transformer":
            raise ValueError(f"field model.fp8: needs kind te_transformer, not {self.kind!r}")
        return self


class Workload(_Strict):
    """The fields a variant may override: what one arm of the run computes and how."""

    implementation: Implementation = "bundled"
    """``bundled`` (cp_attention), ``te`` (stock TE DotProductAttention), ``te_adapter``."""
    cp_comm: CPComm = "p2p"
    """CP communication: P2P ring or all-gather of K/V."""
    strategy: Strategy = "dual_chunk_swap"
    """Token partition: DualChunkSwap (2*cp chunks per sequence) or one chunk per rank."""
    seqlens: list[Annotated[int, Field(ge=1)]] | SeqlenDistribution = Field(
        default_factory=lambda: [8192, 4096, 2048, 2048]
    )
    """Packed sequence lengths (unpadded), explicit or a seeded distribution."""
    heads: int = Field(default=16, ge=1)
    """Query heads."""
    kv_heads: int | None = Field(default=None, ge=1)
    """Key/value heads (GQA); None = ``heads``. Must divide ``heads``."""
    head_dim: int = Field(default=128, ge=1)
    """Channels per head."""
    dtype: DType = "bf16"
    """Activation dtype."""
    causal: bool = True
    """Causal (``padding_causal`` in TE) or full attention within each sequence."""
    layers: int = Field(default=4, ge=1, le=256)
    """Attention layers per iteration (forward + backward through all of them)."""
    metadata: MetadataPassing = "value_equal_clone"
    """How ``cu_seqlens_*_padded`` is passed: the same tensor object as the unpadded one, a
    value-equal clone, or really padded (each sequence rounded up to a multiple of 2*ranks)."""
    pad_between_seqs: bool | None = None
    """Passed to TE's ``forward``; None lets TE decide (the identity detector in TE >= 2.18)."""
    token_alignment: int | None = Field(default=None, ge=1)
    """Pad the packed total to this multiple (8/16/128 for FP8 GEMMs); the padding goes to the
    tail of the last sequence and shows in ``cu_seqlens_padded``."""
    broken_identity_padding: bool = False
    """Bundled only: emulate TE's identity-based padding detector (the slow path)."""
    broken_always_zero_fill: bool = False
    """Bundled only: zero-fill gradient padding even when there is none (the slow backward)."""
    seed: int = 0
    """Seed of the input tensors (same inputs on every variant)."""

    @field_validator("seqlens", mode="before")
    @classmethod
    def _distribution_errors(cls, value: object) -> object:
        # Validate a mapping as a distribution here so its own field errors surface, rather
        # than the union's "Input should be a valid list".
        if isinstance(value, dict):
            try:
                return SeqlenDistribution.model_validate(value)
            except ValidationError as exc:
                first = first_error(exc)
                where = first.where("(distribution)")
                raise ValueError(f"distribution field {where}: {first.message}") from None
        return value

    @model_validator(mode="after")
    def _check_shape(self) -> Workload:
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"field kv_heads: {self.kv_heads} must divide heads ({self.heads})")
        if self.implementation != "bundled" and (
            self.broken_identity_padding or self.broken_always_zero_fill
        ):
            raise ValueError(
                "field broken_identity_padding/broken_always_zero_fill: apply to implementation "
                f"'bundled' only, not {self.implementation!r}"
            )
        if self.implementation == "te_adapter" and self.pad_between_seqs is not None:
            raise ValueError(
                "field pad_between_seqs: te_adapter decides it from values; leave it null"
            )
        return self

    def resolved_seqlens(self) -> list[int]:
        """Explicit lengths, drawing them when the spec gives a distribution."""
        if isinstance(self.seqlens, SeqlenDistribution):
            return self.seqlens.draw()
        return list(self.seqlens)


class RunSpec(Workload):
    """A whole launch: the base workload, run-level settings and the named variants."""

    name: str = Field(min_length=1, max_length=120, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Run name; becomes the bundle's directory name."""
    ranks: int = Field(default=2, ge=1, le=1024)
    """CP size = processes = GPUs (one process per GPU)."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """``cuda`` (NCCL, one GPU per rank), ``cpu`` (gloo; tests and laptops), ``auto``: CUDA if
    available."""
    warmup: int = Field(default=5, ge=0)
    """Untimed iterations per arm before timing (compilation, allocator, NCCL setup)."""
    iterations: int = Field(default=50, ge=0)
    """Timed iterations per arm (interleaved ABBA, no profiler attached)."""
    profilers: Profilers = Field(default_factory=Profilers)
    model: ModelSpec | None = None
    """A real model (``runners/models/``); None = attention layers alone (``runners/arms.py``)."""
    watchdog_s: float = Field(default=60.0, gt=0)
    """After the first rank reports an exception, stop the others this many seconds later (a
    rank that raised before a collective must not leave the rest waiting in it forever)."""
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Variant name -> workload fields it overrides. Empty: one variant named ``base``."""

    @model_validator(mode="after")
    def _check_variants(self) -> RunSpec:
        if not self.variants:
            _check_partition(self, self.ranks, where="")
        for vname, overrides in self.variants.items():
            if not vname or not all(c.isalnum() or c in "_-." for c in vname):
                raise ValueError(f"field variants: name {vname!r}: use letters, digits, _ - .")
            fixed = RUN_LEVEL_FIELDS & set(overrides)
            if fixed:
                raise ValueError(
                    f"field variants.{vname}: overrides run-level field(s) {sorted(fixed)}: "
                    "these are one value per launch"
                )
            self.variant_workload(vname)  # raises with the variant's field named
        torch_model = self.model is not None and self.model.kind == "torch_transformer"
        if torch_model and any(
            self.variant_workload(v).implementation != "bundled" for v in self.variant_names()
        ):
            raise ValueError(
                "field implementation: model torch_transformer runs the bundled cp_attn; "
                "leave implementation 'bundled'"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_additions(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Leave ``model``/``watchdog_s`` out while unset: a spec that does not use them dumps
        exactly as before they existed (recorded bundles keep their bytes and hashes)."""
        data: dict[str, Any] = handler(self)
        if data.get("model") is None:
            data.pop("model", None)
        if data.get("watchdog_s") == RunSpec.model_fields["watchdog_s"].default:
            data.pop("watchdog_s", None)
        return data

    def variant_workload(self, name: str) -> Workload:
        """The workload of one variant: the base fields with the variant's overrides applied."""
        base = self.model_dump(include=set(Workload.model_fields))
        overrides = self.variants.get(name, {}) if self.variants else {}
        try:
            workload = Workload.model_validate({**base, **overrides})
        except ValidationError as exc:
            first = first_error(exc)
            where = first.where("(variant)")
            raise ValueError(f"field variants.{name}.{where}: {first.message}") from None
        _check_partition(workload, self.ranks, where=f"variants.{name}.")
        return workload

    def variant_names(self) -> list[str]:
        """Variant names in spec order (``["base"]`` when the spec declares none)."""
        return list(self.variants) or ["base"]


def _check_partition(workload: Workload, ranks: int, *, where: str) -> None:
    """Fail at config time on packs the partition cannot split (not mid-run on one rank).

    ``where`` prefixes the field name (``"variants.a."``, or ``""`` for the base workload).
    """
    try:
        layout_for(workload, ranks)
    except ValueError as exc:
        raise ValueError(f"field {where}seqlens: {exc}") from None


def layout_for(workload: Workload, ranks: int) -> PackedLayout:
    """The packed layout a workload runs on with ``ranks``-way CP."""
    return build_layout(
        workload.resolved_seqlens(),
        ranks=ranks,
        strategy=workload.strategy,
        metadata=workload.metadata,
        token_alignment=workload.token_alignment,
    )


def parse_spec(raw: object, *, source: str = "spec") -> RunSpec:
    """Validate a decoded spec object.

    :raises SpecError: naming the source, the field and the reason.
    """
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping of fields, got {type(raw).__name__}")
    try:
        return RunSpec.model_validate(raw)
    except ValidationError as exc:
        first = first_error(exc)
        if not first.path:  # a whole-model check: its message names the field itself
            raise SpecError(f"{source}: {first.message}") from None
        raise SpecError(f"{source}: field {first}") from None


def load_spec(path: str | Path) -> RunSpec:
    """Read a YAML (or JSON) spec file.

    :raises SpecError: unreadable file, YAML syntax error or invalid field.
    """
    import yaml  # lazily: only spec loading needs it

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read spec: {exc}") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc
    return parse_spec(raw, source=str(path))
