"""The optional run manifest: facts a trace cannot show (value equality, token counts, timings).

A trace shows *which* kernels ran; it cannot show whether ``cu_seqlens_q_padded`` was equal in
value to ``cu_seqlens_q``, or how many tokens were packed. Runners record those facts when they
build the batch; users can write them by hand. The file is JSON, validated by these models::

    {
      "schema_version": 1,
      "workload": {"implementation": "te", "cp_size": 2, "cp_comm": "p2p",
                   "strategy": "dual_chunk_swap", "causal": true, "heads": 16, "head_dim": 128,
                   "dtype": "bf16", "layers": 4, "seqlens": [8192, 4096, 2048, 2048]},
      "variants": [
        {"name": "auto_clone", "window": "arm:auto_clone",
         "facts": {"cu_seqlens": [0, 8192, 12288, 14336, 16384],
                   "cu_seqlens_padded": [0, 8192, 12288, 14336, 16384],
                   "padded_is_same_object": false, "pad_between_seqs": null},
         "iteration_ms": {"0": [21.3, 21.2], "1": [21.3, 21.1]}}
      ]
    }

``window`` names the annotation range (NVTX or ``record_function``) that encloses the variant's
steps in the trace; a manifest without variants describes the whole trace.
"""

from __future__ import annotations

import itertools
import json
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from contracts.field_defaults import empty_list
from contracts.validation import first_error

MANIFEST_SCHEMA_VERSION = 1
MAX_MANIFEST_BYTES = 16 * 1024**2
"""Largest manifest file accepted (a long run's iteration times stay far below)."""
MAX_JSON_DEPTH = 64
"""Deepest nesting accepted in a manifest (the schema itself nests 4 levels)."""
# A string (unrolled, possessive: linear time and constant regex memory however long it is), or a
# bracket outside strings; the depth check walks these without copying the text.
MAX_INT_DIGITS = 40
"""Longest integer a manifest may hold (128-bit values fit; each field checks its own range)."""
_DEPTH_TOKEN = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[\[\]{}]')

Name = Annotated[str, StringConstraints(max_length=200)]
"""A name people read (variant, window, implementation): capped so no page or report balloons."""


class ManifestError(ValueError):
    """The manifest file is unreadable or does not match the schema."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _OnDemand(_Model):
    """A model only a manifest needs: its schema and validator are made on first use instead of
    at import, as ``analyzers.report._OnDemand`` (most ``cptrace analyze`` runs have no
    manifest; the models nested in a report stay eager)."""

    model_config = ConfigDict(defer_build=True)


class ObservedFacts(_Model):
    """How the in-process probe (``cptrace.probe``) saw the facts, counted over sampled calls.

    Counts are over ``sampled_calls`` calls of the most frequent call signature; a count of None
    means the probe could not observe that fact at this entry point (``not_observed`` says why).
    """

    model_config = ConfigDict(extra="allow")

    source: str = "cptrace.probe"
    function: str | None = None
    """The wrapped entry point (``transformer_engine.DotProductAttention.forward``, ...)."""
    ranks: list[int] = Field(default_factory=empty_list)
    calls: int = 0
    sampled_calls: int = 0
    same_object_calls: int | None = None
    """Sampled calls where ``cu_seqlens_*_padded is cu_seqlens_*``."""
    value_equal_calls: int | None = None
    """Sampled calls where padded and unpadded offsets were equal in every entry."""
    pad_between_seqs_passed: dict[str, int] = Field(default_factory=dict)
    """Value passed (JSON spelling: ``"null"``, ``"true"``, ``"false"``) -> sampled calls."""
    pad_between_seqs_resolved: dict[str, int] = Field(default_factory=dict)
    """What TE resolved it to (read inside the call) -> sampled calls; empty: not observed."""
    seqlens_divisible_2cp_calls: int | None = None
    local_tokens_aligned: dict[str, int] = Field(default_factory=dict)
    """Multiple (8, 16, 128) -> sampled calls whose per-rank token count was a multiple of it."""
    fp8_recipes: list[str] = Field(default_factory=empty_list)
    fsdp: list[str] = Field(default_factory=empty_list)
    transformer_engine: str | None = None
    not_observed: list[str] = Field(default_factory=empty_list)


class FailureRecord(_Model):
    """How a run that did not end cleanly ended (``runners/profile/supervise.py``)."""

    model_config = ConfigDict(extra="allow")

    summary: str = ""
    exit_status: int | None = None
    failed_rank: int | None = None
    failed_ranks: list[int] = Field(default_factory=empty_list)
    exception: dict[str, object] | None = None
    """``{type, message, where: {file, line, function}, traceback}`` of the first failure."""
    ranks: dict[str, dict[str, object]] = Field(default_factory=dict)
    """rank -> last status (``state``: failed/waiting/running/exited, ``collective``)."""
    stopped_by_watchdog: bool = False
    watchdog_s: float | None = None
    timed_out: bool = False
    stacks: dict[str, str] = Field(default_factory=dict)
    """rank -> the Python stack of every thread of that rank (``faulthandler`` text), dumped by
    the watchdog before it stopped a hung job: where each rank was waiting."""
    log_tail: list[str] = Field(default_factory=empty_list)
    """The last lines of the job's combined output (already redacted of secrets)."""


class MetadataFacts(_Model):
    """Packed-batch metadata as the workload passed it to attention."""

    cu_seqlens: list[int] | None = None
    """Unpadded cumulative sequence lengths (``cu_seqlens_q``; KV assumed equal unless given)."""
    cu_seqlens_padded: list[int] | None = None
    """Padded cumulative sequence lengths (``cu_seqlens_q_padded``)."""
    cu_seqlens_kv: list[int] | None = None
    cu_seqlens_kv_padded: list[int] | None = None
    padded_is_same_object: bool | None = None
    """True when the padded tensor passed *is* the unpadded tensor object (TE's identity check)."""
    pad_between_seqs: bool | None = None
    """The value passed to TE's ``DotProductAttention.forward`` (None = let TE decide)."""
    total_tokens: int | None = None
    """Packed token count on one rank before CP partitioning (defaults to cu_seqlens_padded[-1])."""
    fp8: bool = False
    fsdp: bool = False
    token_alignment: int | None = None
    """The multiple the batch was padded to (8, 16, 128), if any."""
    zero_fill_grad_tails: bool | None = None
    """Whether the implementation zero-fills gradient padding in backward (None = unknown)."""
    observed: ObservedFacts | None = None
    """Set when the facts come from the probe inside the process rather than from the spec."""

    @model_validator(mode="after")
    def _check_cu_seqlens(self) -> MetadataFacts:
        for name in ("cu_seqlens", "cu_seqlens_padded", "cu_seqlens_kv", "cu_seqlens_kv_padded"):
            values = getattr(self, name)
            if values is None:
                continue
            if len(values) < 2 or values[0] != 0:
                raise ValueError(f"{name} must start at 0 and hold at least two entries")
            if any(b < a for a, b in itertools.pairwise(values)):
                raise ValueError(f"{name} must be non-decreasing")
        if (
            self.cu_seqlens
            and self.cu_seqlens_padded
            and len(self.cu_seqlens) != len(self.cu_seqlens_padded)
        ):
            raise ValueError("cu_seqlens and cu_seqlens_padded must have the same length")
        return self


class Workload(_Model):
    """What ran. Unknown fields stay None; rules that need them then say so."""

    model_config = ConfigDict(extra="allow")

    implementation: Name | None = None  # "bundled" | "te" | "te-adapter"
    cp_size: int | None = None
    cp_comm: Literal["p2p", "all_gather", "a2a"] | None = None
    strategy: Literal["dual_chunk_swap", "no_load_balance"] | None = None
    causal: bool | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype: Name | None = None
    layers: int | None = None
    seqlens: list[int] | None = None


class VariantManifest(_OnDemand):
    """One arm of an A/B run."""

    name: Name
    window: Name | None = None
    """Annotation name enclosing this variant's steps; None = the whole trace."""
    facts: MetadataFacts = Field(default_factory=MetadataFacts)
    workload: dict[str, object] = Field(default_factory=dict)
    """Fields of the run's workload this variant overrides."""
    iteration_ms: dict[int, list[float]] = Field(default_factory=dict)
    """rank -> measured iteration times in ms (CUDA events)."""
    steps_per_window: int | None = Field(default=None, ge=1)
    """Steps inside each occurrence of ``window`` when the trace marks no steps inside it (an nsys
    capture of an arm's last N steps); per-step numbers divide by it."""


class SyncRecording(StrEnum):
    """How one rank's sync lines were recorded (``runners/profile/synclines.py``)."""

    WARN = "warn"
    """CUDA's sync debug mode ``warn`` was on while the PyTorch profiler ran."""
    NO_CUDA = "no_cuda"
    """CUDA was not initialised when profiling started (a CPU run): no CUDA sync to record."""


MAX_SYNC_SITES = 1000
"""Call sites kept per rank (the recorder keeps no more)."""


class SyncCallSite(_OnDemand):
    """One line of the user's code that made synchronizing CUDA calls while profiling."""

    file: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    """The frame's file as the process named it (``co_filename``: usually a full path)."""
    line: int = Field(ge=1, le=2**31)
    """The line of the call (``.item()``, ``.cpu()``, ``torch.cuda.synchronize()``)."""
    function: Name
    first_line: int = Field(ge=1, le=2**31)
    """The function's first line (``co_firstlineno``): what Kineto names the frame by."""
    count: int = Field(ge=1)
    """Synchronizing CUDA calls made at that line while the profiler ran (all its steps)."""
    message: Annotated[str, StringConstraints(max_length=500)] = ""


class SyncLines(_OnDemand):
    """One rank's record of the lines behind its synchronizing CUDA calls (``cptrace profile
    --torch``): the analysis points a host sync at ``sites``' line instead of Kineto's."""

    rank: int = Field(ge=0, le=2**31)
    mode: SyncRecording
    sites: list[SyncCallSite] = Field(default_factory=empty_list, max_length=MAX_SYNC_SITES)
    dropped: int = Field(default=0, ge=0)
    """Syncs at sites beyond ``MAX_SYNC_SITES`` (not in ``sites``)."""
    unplaced: int = Field(default=0, ge=0)
    """Syncs not counted at a site: no frame of the user's code on the stack, or one of
    cptrace's profile hooks made them."""


class RunManifest(_OnDemand):
    """Facts about a run that its traces cannot show."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = MANIFEST_SCHEMA_VERSION
    workload: Workload = Field(default_factory=Workload)
    variants: list[VariantManifest] = Field(default_factory=empty_list)
    environment: dict[str, object] = Field(default_factory=dict)
    failure: FailureRecord | None = None
    """Present when the run failed or hung (which rank, where, why)."""
    sync_lines: list[SyncLines] = Field(default_factory=empty_list, max_length=65536)
    """Per rank, the lines of the synchronizing CUDA calls (``cptrace profile --torch``);
    empty: not recorded (another runner, ``--no-sync-lines``, nsys only)."""

    def effective_workload(self, variant: VariantManifest) -> Workload:
        """The run's workload with the variant's overrides applied."""
        merged = {**self.workload.model_dump(), **variant.workload}
        return Workload.model_validate(merged)


def load_manifest(path: str | Path) -> RunManifest:
    """Read and validate a manifest file.

    :raises ManifestError: naming the file and the first invalid field.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{path}: {size} bytes, over the {MAX_MANIFEST_BYTES}-byte limit")
        data = path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read manifest JSON: {exc}") from exc
    return parse_manifest(load_json_strict(data, source=str(path)), source=str(path))


def load_json_strict(data: bytes | str, *, source: str, max_depth: int = MAX_JSON_DEPTH) -> object:
    """Decode JSON strictly: UTF-8, no NaN/Infinity (not JSON; they would be stored and served
    back as invalid JSON), nesting at most ``max_depth`` (deeper would be a RecursionError),
    integers of at most ``MAX_INT_DIGITS`` digits (never a 4,300-digit conversion).

    :raises ManifestError: naming ``source`` and what is wrong.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{source}: is not valid JSON (not UTF-8: {exc})") from exc
    depth = deepest = 0
    for match in _DEPTH_TOKEN.finditer(text):
        char = text[match.start()]
        if char == '"':
            continue
        depth += 1 if char in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > max_depth:
                raise ManifestError(
                    f"{source}: is not valid JSON: nested deeper than {max_depth} levels"
                )

    def refuse(constant: str) -> object:
        raise ManifestError(f"{source}: is not valid JSON: {constant} is not a JSON number")

    def bounded(digits: str) -> int:
        # Fields check their own ranges (a rank of 2^63 is that field's 422); this only keeps
        # Python from converting a 4,300-digit number (slow, then a ValueError).
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise ManifestError(
                f"{source}: integer {digits[:24]}... is out of range (at most "
                f"{MAX_INT_DIGITS} digits)"
            )
        return int(digits)

    try:
        return json.loads(text, parse_constant=refuse, parse_int=bounded)
    except ManifestError:
        raise
    except ValueError as exc:  # JSONDecodeError, and int conversions Python refuses
        raise ManifestError(f"{source}: is not valid JSON: {exc}") from exc


def parse_manifest(raw: object, *, source: str = "manifest") -> RunManifest:
    """Validate an already-decoded manifest object."""
    try:
        manifest = RunManifest.model_validate(raw)
    except ValidationError as exc:
        raise ManifestError(f"{source}: field {first_error(exc)}") from exc
    if manifest.schema_version > MANIFEST_SCHEMA_VERSION:
        raise ManifestError(
            f"{source}: schema_version {manifest.schema_version} is newer than this cptrace "
            f"understands ({MANIFEST_SCHEMA_VERSION}); upgrade cptrace"
        )
    return manifest
