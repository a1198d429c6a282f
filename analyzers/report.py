"""The analysis output contract: plain pydantic models the service stores and the web renders.

Everything here is JSON-serializable (``model_dump(mode="json")``) and versioned by
``REPORT_SCHEMA_VERSION``; a stored report with an older version is re-analysed, never patched.
Times are nanoseconds (``*_ns``) unless a field says milliseconds (``*_ms``).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from analyzers.manifest import FailureRecord, Workload
from contracts.field_defaults import empty_list

REPORT_SCHEMA_VERSION = 3
"""2: ``launches`` counts CPU launch calls everywhere (1 counted GPU activities in helper and
rank rows); the GPU timeline, device figures and kernel tables. 3: ``environment`` records what
ran and how it was captured (workload, variants, command, cuDNN, profilers, trace slices): the
comparability check reads them, so older reports are re-analysed."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class _OnDemand(_Model):
    """A model of the comparison, which ``analyze`` never builds: its schema and validator are
    made on first use instead of at import.

    Why: pydantic builds every model's schema and validator when the class is created, most of
    this module's import time; every ``cptrace analyze`` imports the module for its report and
    none compares. (A model nested in a report model stays eager: deferring it would build its
    schema twice, inside its parent's and on its own first use.)"""

    model_config = ConfigDict(defer_build=True)


class Severity(StrEnum):
    """How urgent a finding is. ``error`` means wrong results, not just slow ones."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class Category(StrEnum):
    """Helper categories of the catalog."""

    METADATA = "metadata"
    ZERO_FILL = "zero-fill"
    PARTITION = "partition/correction"
    ATTENTION = "attention compute"
    COMMUNICATION = "communication"
    HOST_SYNC = "host sync"
    OTHER = "other"


UNATTRIBUTED = "(unattributed)"
"""Helper name for GPU activity no catalog entry claims."""


class SourceInfo(_Model):
    """One input file and what the reader could and could not get from it."""

    path: str
    format: str  # "nsys" | "kineto"
    ranks: list[int]
    activities: int
    launches: int
    ranges: int
    notes: list[str] = Field(default_factory=empty_list)


class Window(_Model):
    """A time window analysed on its own: a step, an arm of an A/B run, or the whole trace."""

    rank: int
    name: str  # "ProfilerStep#3", "arm:auto_clone", "whole trace"
    index: int  # order within (rank, kind)
    kind: str  # "step" | "window" | "trace"
    start_ns: int
    end_ns: int
    group: str | None = None
    """Window group the window is aggregated under ("ProfilerStep", "arm:auto_clone", ...)."""


class HelperStat(_Model):
    """Launches and GPU time of one helper on one rank within one window group.

    ``window`` is the window name ("arm:auto_clone") or "whole trace"; ``steps`` is how many
    windows of that name were summed (divide to get per-step numbers).
    """

    rank: int
    window: str
    steps: int
    helper: str
    category: Category
    launches: int  # CPU launch calls behind the helper's activities (a graph launch counts once)
    kernels: int  # GPU kernel activities
    gpu_time_ns: int  # summed duration of the helper's activities
    matched_by: str  # "range" | "python" | "kernel-name" | "none" (how most rows were matched)
    calls: int = 0  # outermost catalogued ranges of the helper (host-side calls) in the windows
    host_time_ns: int = 0  # summed duration of those ranges on the CPU
    activities: int = 0  # GPU activities (kernels + memcpy + memset) attributed to the helper
    first_call_host_ns: int = 0
    """Host time of the rank's first call of the helper in the whole trace when that call falls
    in this group (0 otherwise): a compiled helper's first call includes its compilation, so
    steady-state host time is ``host_time_ns - first_call_host_ns`` over ``calls - 1`` calls."""


class StreamStat(_Model):
    """Busy time and idle gaps of one GPU stream on one rank within one window group."""

    rank: int
    window: str
    device: int
    stream: int
    activities: int
    busy_ns: int  # union of activity intervals, overlaps counted once
    gaps: int  # idle gaps longer than the gap threshold between first and last activity
    gap_ns: int
    first_ns: int
    last_ns: int


class HostSyncStat(_Model):
    """Host-blocking calls (stream/device sync, blocking copies) in one window group on one rank."""

    rank: int
    window: str
    steps: int
    helper: str  # the catalogued range the calls were made in, or UNATTRIBUTED
    calls: int
    blocked_ns: int  # summed duration of the synchronising API calls
    api: str  # the most frequent label among the calls (the sync op around it, else the API)
    apis: dict[str, int] = Field(default_factory=dict)
    """Blocking calls per API kind (``cudaStreamSynchronize``, ``cudaMemcpyAsync``, a D2H copy)."""
    ops: dict[str, int] = Field(default_factory=dict)
    """Host-sync operator calls (``aten::_local_scalar_dense``, ...) the blocking calls sat in,
    per operator: one op can make several blocking calls, so these counts differ from ``apis``."""


class RankSummary(_Model):
    """Totals for one rank within one window group."""

    rank: int
    window: str
    steps: int
    span_ns: int  # sum of window durations
    gpu_busy_ns: int  # the clipped timeline's busy: union of all activities, within the windows
    kernels: int  # GPU kernel activities placed in the windows (by launch time)
    launches: int  # CPU launch calls of the rank that start inside the windows
    attributed_fraction: float  # share of GPU time attributed to a catalog helper
    compute_busy_ns: int = 0
    """The clipped timeline's computation: union of non-NCCL kernels and memsets in the windows
    (NCCL kernels spin while they wait, so they are not compute)."""
    activities: int = 0  # GPU activities (kernels + memcpy + memset) placed in the windows


class WindowBasis(StrEnum):
    """Which interval a timeline window covers."""

    GPU_ANNOTATION = "gpu annotation"
    """Kineto ``gpu_user_annotation`` of the step (first to last GPU activity the step's
    annotation enclosed, on any stream), extended to the end of the work launched inside the CPU
    step on any thread, never into the next window (``analyzers.timeline``)."""
    GPU_PROJECTION = "gpu projection"
    """nsys: the step's CPU range projected onto the GPU, as ``nsys stats``' NVTX GPU
    projection does: from the start of the first GPU activity launched inside the CPU range
    (on any thread of the rank) to the end of the last, never into the next window."""
    CPU_RANGE = "cpu range"
    """The step's (or variant's) CPU range: a variant window on nsys, Kineto without a GPU
    annotation, a step that launched nothing."""
    TRACE = "trace span"
    """The rank's whole trace."""


class GpuTimeParts(_Model):
    """The GPU timeline of a window, activities clipped to it; all integer ns.

    ``busy = computation + exposed_communication + exposed_memcpy`` and
    ``total = busy + idle``; busy never exceeds total.
    """

    total_ns: int = 0  # window length
    computation_ns: int = 0  # union of kernels (not NCCL) and memsets
    busy_ns: int = 0  # union of every GPU activity (kernels, memcpy, memset)
    exposed_memcpy_ns: int = 0  # memcpy time under neither computation nor NCCL
    exposed_communication_ns: int = 0  # NCCL kernel time not overlapped by computation
    idle_ns: int = 0  # total - busy


class WindowTimeline(GpuTimeParts):
    """The GPU timeline decomposition of one window on one rank."""

    rank: int
    window: str  # the window group ("ProfilerStep", "arm:auto_clone", "whole trace")
    name: str  # the window's own name ("ProfilerStep#3")
    index: int
    basis: WindowBasis
    start_ns: int
    end_ns: int
    cpu_start_ns: int | None = None
    """The window's CPU range, beside the interval measured (``start_ns``/``end_ns``)."""
    cpu_end_ns: int | None = None


class GroupTimeline(GpuTimeParts):
    """Sums of ``WindowTimeline`` over one rank's windows of one group.

    Per-step figures are these sums divided by ``steps`` (and say so).
    """

    rank: int
    window: str
    steps: int
    windows: int  # how many windows were summed (steps / steps_per_window)
    basis: WindowBasis  # the basis of most of the summed windows


class DeviceFigures(_Model):
    """Whole-trace reference figures of one device of one rank (never per step).

    Times are sums of ``end - start`` over the activities, in ns: not unions (overlapping
    kernels on two streams both count); ``gpu_time_ns`` = kernel + memcpy + memset time.
    """

    rank: int
    device: int
    kernels: int  # GPU kernel activities
    kernel_time_ns: int
    kernel_first_ns: int | None  # start of the first kernel
    kernel_last_ns: int | None  # end of the last kernel
    kernel_span_ns: int  # kernel_last_ns - kernel_first_ns (0 without kernels)
    kernels_with_launch: int  # kernels joined to a CPU launch row (by correlation id)
    kernels_without_launch: int  # e.g. time-sliced exports, or launches outside the capture
    memcpy: int
    memcpy_time_ns: int
    memcpy_bytes: int  # summed over the copies whose byte count the trace records
    memcpy_bytes_unknown: int  # copies without a byte count
    memset: int
    memset_time_ns: int
    memset_bytes: int
    memset_bytes_unknown: int
    gpu_time_ns: int


class KernelStat(_Model):
    """One row of the per-kernel-name table (the columns of ``nsys stats`` ``cuda_gpu_kern_sum``)
    within one window group: per rank, or summed over ranks when ``rank`` is None."""

    rank: int | None
    window: str
    steps: int  # steps of the group (the largest over ranks for rank=None): divide for per step
    name: str
    count: int  # instances
    total_ns: int
    average_ns: float  # total / count
    median_ns: float  # middle duration; mean of the two middle ones for an even count
    min_ns: int
    max_ns: int
    stddev_ns: float  # sample standard deviation (n - 1); 0 for one instance
    time_pct: float  # share of the (rank's, or all ranks') kernel time in the group
    names: int = 1
    """Kernel names the row holds: 1, or more on the one row named ``(other kernel names)``
    that holds every name past the table's first 100 (``analyzers.kernels.MAX_KERNEL_ROWS``)."""


class Imbalance(_Model):
    """Cross-rank spread of one metric within one window group."""

    window: str
    metric: str  # "gpu_busy_ns" | "compute_busy_ns" | "span_ns" | "kernels"
    per_rank: dict[int, float]
    max_over_min: float
    max_over_mean: float


class TimelineEvent(_Model):
    """One GPU activity of a decimated timeline for the dashboard."""

    rank: int
    stream: int
    start_ns: int  # relative to the timeline window start
    end_ns: int
    name: str
    helper: str
    category: Category


class AccountPartKind(StrEnum):
    """The parts a step's time is split into (``analyzers.account``); they add up to the span."""

    COMPUTE = "compute"
    EXPOSED_COMMUNICATION = "exposed communication"
    EXPOSED_MEMCPY = "exposed memcpy"
    IDLE_HOST = "idle: host-bound"
    IDLE_SYNC = "idle: synchronisation"
    IDLE_PEER = "idle: waiting on another rank"
    IDLE_OTHER = "idle: other"


class TimelineStep(_Model):
    """The window a timeline draws for one rank; event and gap times are relative to
    ``origin_ns`` (the window's start, trace clock)."""

    rank: int
    window: str  # the window's name, e.g. "ProfilerStep#5"
    index: int  # Window.index
    origin_ns: int


class TimelineGap(_Model):
    """One idle piece of the drawn window's step account (``analyzers.account``): the GPU of
    ``rank`` was idle over ``[start_ns, end_ns)`` (relative to the window start) because of
    ``part`` / ``label`` ("idle: host-bound" / "get_cu_seqlens_on_cp_rank")."""

    rank: int
    start_ns: int
    end_ns: int
    part: AccountPartKind
    label: str


class Timeline(_Model):
    """One step per rank, decimated to at most ``limit`` events per rank (longest kept).

    ``gaps``: the idle pieces of the same windows (at most ``limit`` per rank, longest kept;
    ``gaps_dropped`` counts the rest), so the page draws the gaps on the events' clock."""

    window: str
    limit: int
    dropped: int
    events: list[TimelineEvent]
    steps: list[TimelineStep] = Field(default_factory=empty_list)
    gaps: list[TimelineGap] = Field(default_factory=empty_list)
    gaps_dropped: int = 0


class Evidence(_Model):
    """A number behind a finding, with its unit and where it came from."""

    name: str
    value: float | int | str | bool | None
    unit: str = ""
    rank: int | None = None
    window: str | None = None


class Finding(_Model):
    """A diagnosis: what is wrong, the proof, and what exactly to change."""

    rule: str  # stable identifier, e.g. "padded-path-without-padding"
    title: str
    severity: Severity
    helper: str | None = None
    window: str | None = None
    ranks: list[int] = Field(default_factory=empty_list)
    evidence: list[Evidence] = Field(default_factory=empty_list)
    recommendation: str
    expected_saving_ms: float | None = None  # per iteration, when it can be estimated
    expected_saving_pct: float | None = None
    references: list[str] = Field(default_factory=empty_list)  # e.g. "TE issue #3331"
    saving_basis: str | None = None
    """How ``expected_saving_ms`` was obtained: "measured" (median difference of timed arms of
    the same run) or "estimate" (helper GPU time plus launches x a per-launch host cost)."""


class IterationStats(_Model):
    """Distribution of iteration times (ms) for one variant/window on one rank (or all ranks)."""

    label: str
    rank: int | None
    n: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    iqr_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    samples_ms: list[float]
    source: str | None = None
    """"timed": the manifest's CUDA-event iterations (no profiler attached); "profiled": window
    durations of profiled steps (inflated by the profiler, with Python stacks several-fold)."""


class AccountGap(_Model):
    """One piece of time behind an account part (a gap, or the exposed share of an activity)."""

    start_ns: int  # trace clock
    offset_ns: int  # from the start of the window it lies in
    duration_ns: int
    window: str  # the window's own name ("ProfilerStep#3")
    index: int  # the window's index within its (rank, group)
    thread: str | None = None  # the launching thread (host-side parts)


class AccountPart(_Model):
    """One line of a step account: a part, who it is attributed to, its time and its evidence."""

    part: AccountPartKind
    label: str  # helper, collective (ring step), range name, sync op, "unannotated host", ...
    category: Category | None = None  # the helper's category, where the label is a helper
    time_ns: int
    gaps: int  # how many gaps (idle parts) or activities (busy parts) contribute
    largest: list[AccountGap] = Field(default_factory=empty_list)  # the largest few, longest first
    thread: str | None = None  # the thread with most of the time (host-side parts)
    detail: str | None = None  # the sync API and Python frame, the late peer, the copy kind


class StepAccount(_Model):
    """Where one window's time went on one rank: ``sum(p.time_ns for p in parts) == span_ns``."""

    rank: int
    window: str  # group
    name: str
    index: int
    basis: WindowBasis
    start_ns: int
    end_ns: int
    span_ns: int
    parts: list[AccountPart]


class GroupAccount(_Model):
    """The accounts of one rank's windows of one group, summed (divide by ``steps``)."""

    rank: int
    window: str
    steps: int
    windows: int
    span_ns: int
    parts: list[AccountPart]


class AccountDelta(_OnDemand):
    """One account line of base and head side by side: ns per step, mean over ranks."""

    part: AccountPartKind
    label: str
    category: Category | None = None
    base_ns: float
    head_ns: float
    delta_ns: float


HOST_TIME_BASIS = "host ranges (annotation ranges on the CPU; no GPU activity needed)"


class HelperHostTime(_Model):
    """Host-side calls and time of one helper on one rank within one window group, from the
    annotation ranges alone (``analyzers.host_time`` defines each figure)."""

    rank: int
    window: str
    steps: int
    """Windows of the group on this rank: divide by it for per-step numbers (the whole trace is
    one window per rank, so its numbers are totals over the trace)."""
    helper: str
    category: Category
    calls: int  # outermost ranges of the helper
    inclusive_ns: int  # summed duration of those calls
    self_ns: int  # inclusive minus other catalogued helpers' ranges nested inside
    first_call_ns: int = 0
    """Duration of the rank's first call of the helper in the whole trace, when that call is
    one of these (compilation, warm-up); steady state is ``inclusive_ns - first_call_ns``."""
    sync_ops: int = 0
    """Catalogued host-sync operators (``[host_sync] ops``: ``aten::item``, ...) started inside
    these calls on the same thread; on a GPU tensor each waits for the device."""


class HostTimeReport(_Model):
    """Host time per helper for every window group (``analyzers.host_time``)."""

    basis: str = HOST_TIME_BASIS
    gpu_activity: bool
    """Whether the trace has GPU activity (if not, these are the only per-helper figures)."""
    helpers: list[HelperHostTime] = Field(default_factory=empty_list)


class VariantWorkload(_Model):
    """The workload one variant's window ran: the run's workload with the variant's overrides."""

    window: str  # the variant's window group ("arm:auto_clone")
    variant: str
    workload: Workload
    overrides: list[str] = Field(default_factory=empty_list)
    """The workload fields the variant overrides: what its A/B experiment varies."""


class RunEnvironment(_Model):
    """What the run ran on, as far as the traces and the manifest say (None: not recorded).

    ``analyzers.comparability`` compares two of these before any comparison."""

    gpu_models: list[str] = Field(default_factory=empty_list)  # distinct device names in the traces
    world_size: int | None = None  # distributedInfo.world_size, else the number of ranks
    torch: str | None = None  # manifest environment
    transformer_engine: str | None = None  # manifest environment
    cudnn: str | None = None  # manifest environment (torch.backends.cudnn.version())
    workload: Workload | None = None
    """The manifest's workload (None: no manifest, or an empty workload block)."""
    command: str | None = None
    """The job's command line for a ``cptrace profile`` run (its workload is the command)."""
    variants: list[VariantWorkload] = Field(default_factory=empty_list)
    profilers: list[str] = Field(default_factory=empty_list)
    """The profilers behind the traces: "nsys", "kineto", "kineto with Python stacks"."""
    trace_slices: list[str] = Field(default_factory=empty_list)
    """How the traces are cut short of the run (an nsys export or capture limited to a time
    window, kernels without their launch): per-window counts there are not comparable."""


class KernelFamily(StrEnum):
    """What a GPU activity does, by library: the summary's first table."""

    GEMM = "GEMM"
    ATTENTION = "attention"
    COMMUNICATION = "communication"
    CONVOLUTION = "convolution / normalisation"
    EMBEDDING = "embedding / quantize"
    OPTIMIZER = "optimizer"
    ELEMENTWISE = "elementwise / reduction"
    MEMORY = "memory (memcpy / memset)"
    OTHER = "other"


class FamilyRow(_Model):
    """GPU activities of one family and library (catalog entry) over the whole trace."""

    family: KernelFamily
    library: str  # the catalog entry claiming them (``gemm``, ``nccl_all_reduce``) or UNATTRIBUTED
    activities: int
    gpu_time_ns: int
    share: float  # of the trace's summed GPU activity time


class OpRow(_Model):
    """One name of CPU operator or annotation range, over the whole trace and all ranks."""

    name: str
    calls: int
    inclusive_ns: int  # summed durations of its ranges
    self_ns: int  # inclusive minus the time of the ranges directly inside them


class SyncPointer(_Model):
    """Where in the user's code the host blocked on the GPU (traces with Python stacks)."""

    frame: str
    """``train.py:50 in zero_tail``: the innermost frame outside torch and libraries, at the
    line of the call when the profiled process recorded it (``call_lines``), else at the line
    Kineto names the frame by (its def line, or the line running when profiling started)."""
    op: str
    """The host-sync operator called there (``aten::item``), or the blocking CUDA call made
    outside any (``cudaDeviceSynchronize`` of ``torch.cuda.synchronize()``)."""
    calls: int
    step_calls: int = 0
    """Of ``calls``, those inside a step window (a sync between steps is harmless)."""
    blocking_calls: int | None = None
    """Blocking CUDA calls (stream/device syncs, blocking copies) made inside those calls; 0:
    they waited for nothing (``.item()`` of a CPU tensor); None: the trace has no GPU."""
    gpu_idle_ns: int | None = None
    """Whole trace: the GPU idle time from each blocking call's site until the GPU's next
    activity after it (``analyzers.findings.summary``); None: the trace has no GPU."""
    saving_ms: float | None = None
    """Per step, estimated: the GPU idle after the sites inside the steps, divided by the
    steps (the largest rank's); None without steps or without GPU."""
    call_lines: list[int] = Field(default_factory=empty_list)
    """The lines of the synchronizing CUDA calls in the frame's function, as the profiled
    process recorded them (the manifest's ``sync_lines``, ``cptrace profile --torch`` on CUDA),
    most calls first; empty: not recorded, ``frame`` holds Kineto's line."""

    @property
    def text(self) -> str:
        """``train.py:50 in zero_tail: aten::item x20, 20 blocking, 0.31 ms GPU idle after``:
        the one wording of the terminal and the run page."""
        head = f"{self.frame}: {self.op} x{self.calls}"
        if self.blocking_calls is None:
            return head
        if self.blocking_calls == 0:
            return f"{head} (no blocking CUDA call inside: they waited for nothing)"
        idle = (self.gpu_idle_ns or 0) / 1e6
        return f"{head}, {self.blocking_calls} blocking, {idle:.3f} ms GPU idle after"


class Action(_Model):
    """One entry of "do this first": a change, what it saves, and the evidence."""

    action: str
    saving_ms: float | None = None
    saving_basis: str | None = None  # "measured", "estimate", or None when not quantified
    evidence: str
    rule: str | None = None

    @property
    def saving_text(self) -> str:
        """``saves ~1.23 ms per iteration (estimate)``, or "" when not quantified: the one
        wording of the terminal, the run page and the PR comment."""
        if self.saving_ms is None:
            return ""
        basis = f" ({self.saving_basis})" if self.saving_basis else ""
        return f"saves ~{self.saving_ms:.2f} ms per iteration{basis}"


class TraceSummary(_Model):
    """Something to say about any trace, TE or not: whole trace, all ranks (totals)."""

    families: list[FamilyRow] = Field(default_factory=empty_list)
    cpu_ops: list[OpRow] = Field(default_factory=empty_list)
    """Top CPU operators (``aten::*``) by self time."""
    ranges: list[OpRow] = Field(default_factory=empty_list)
    """NVTX / ``record_function`` ranges no catalog entry names, by inclusive time."""
    communication_share: float | None = None
    """Communication's share of GPU activity time; on a run without GPU activity, of the
    host time of operators (gloo collectives run on the CPU)."""
    sync_pointers: list[SyncPointer] = Field(default_factory=empty_list)
    do_first: list[Action] = Field(default_factory=empty_list)
    """At most three actions, the largest saving first."""


class AnalysisReport(_Model):
    """Everything ``analyze`` knows about one set of traces (one run)."""

    schema_version: int = REPORT_SCHEMA_VERSION
    catalog_version: str
    sources: list[SourceInfo]
    ranks: list[int]
    windows: list[Window]
    helpers: list[HelperStat]
    streams: list[StreamStat]
    rank_summaries: list[RankSummary]
    imbalance: list[Imbalance]
    iterations: list[IterationStats] = Field(default_factory=empty_list)
    findings: list[Finding]
    timeline: Timeline | None = None
    other_timelines: list[Timeline] = Field(default_factory=empty_list)
    """The dashboard timeline (with its idle gaps) of every other step group."""
    notes: list[str] = Field(default_factory=empty_list)
    host_syncs: list[HostSyncStat] = Field(default_factory=empty_list)
    groups: list[str] = Field(default_factory=empty_list)
    """Window-group names in report order; "whole trace" is always last."""
    gpu_timeline: list[GroupTimeline] = Field(default_factory=empty_list)
    """Per (rank, window group): the GPU timeline decomposition summed over its windows."""
    window_timelines: list[WindowTimeline] = Field(default_factory=empty_list)
    """The same decomposition for every window (each step on its own)."""
    accounts: list[GroupAccount] = Field(default_factory=empty_list)
    """Per (rank, window group): where the steps' time went (``analyzers.account``)."""
    step_accounts: list[StepAccount] = Field(default_factory=empty_list)
    """The same account for every window on its own."""
    devices: list[DeviceFigures] = Field(default_factory=empty_list)
    """Whole-trace reference figures per (rank, device)."""
    kernels: list[KernelStat] = Field(default_factory=empty_list)
    """Per-kernel-name tables per window group, per rank and summed over ranks."""
    environment: RunEnvironment = Field(default_factory=RunEnvironment)
    host_time: HostTimeReport | None = None
    summary: TraceSummary | None = None
    """Top kernels by family, top CPU ops, uncatalogued ranges, sync pointers, do this first."""
    """Host time per helper from the ranges (the only per-helper figures of a CPU-only trace)."""
    failure: FailureRecord | None = None
    """The manifest's failure record when the run's job failed or hung: the traces cover only
    what ran before it (``analyzers.failure`` words it)."""


class HelperDelta(_OnDemand):
    """Per-helper change between base and head (per step, summed over ranks)."""

    helper: str
    category: Category
    base_launches: float
    head_launches: float
    delta_launches: float
    base_gpu_time_ns: float
    head_gpu_time_ns: float
    delta_gpu_time_ns: float
    status: str  # "changed" | "unchanged" | "appeared" | "disappeared"
    """"changed" when the launch calls differ at all, or GPU or host time beyond the noise
    (``analyzers.compare.TIME_NOISE_*``)."""
    base_host_time_ns: float = 0.0
    """CPU time inside the helper's ranges per step, the first call excluded."""
    head_host_time_ns: float = 0.0
    delta_host_time_ns: float = 0.0
    base_activities: float = 0.0  # GPU activities per step, summed over ranks
    head_activities: float = 0.0
    delta_activities: float = 0.0


class KernelDelta(_OnDemand):
    """Per-kernel-name change between base and head: count and total time per step summed over
    ranks (``ComparisonReport.basis``), mean duration per instance."""

    name: str
    base_count: float
    head_count: float
    delta_count: float
    base_total_ns: float
    head_total_ns: float
    delta_total_ns: float
    base_mean_ns: float  # total / count over the whole group (0 when absent)
    head_mean_ns: float
    delta_mean_ns: float
    status: str  # "changed" | "unchanged" | "appeared" | "disappeared"


class RankDelta(_OnDemand):
    """One rank's per-step figures on both sides (ranks present on one side only: None there)."""

    rank: int
    base_span_ns: float | None
    head_span_ns: float | None
    base_busy_ns: float | None  # clipped GPU timeline busy
    head_busy_ns: float | None
    base_gpu_time_ns: float | None  # summed activity durations
    head_gpu_time_ns: float | None


class GpuTotal(_OnDemand):
    """Total GPU time (kernel + memcpy + memset durations) per step, summed over ranks."""

    base_ns: float
    head_ns: float
    delta_ns: float
    base_kernel_ns: float
    head_kernel_ns: float
    delta_kernel_ns: float


class IterationComparison(_OnDemand):
    """Robust comparison of iteration times; ``method`` states the statistics used."""

    base: IterationStats
    head: IterationStats
    delta_median_ms: float
    delta_median_pct: float
    ci_low_ms: float  # confidence interval of the median difference (head - base)
    ci_high_ms: float
    confidence: float  # e.g. 0.95
    interval: bool = True
    """False when a side has one sample: no interval exists (``ci_*`` are then the point
    difference), and text says ``NO_INTERVAL`` instead of a zero-width interval."""
    p_value: float  # Mann-Whitney U, two-sided
    method: str
    verdict: str  # "faster" | "slower" | "no significant change"


class ComparabilityAspect(StrEnum):
    """What two runs must share before their times can be compared."""

    WORKLOAD = "workload"
    IMPLEMENTATION = "implementation"
    WORLD_SIZE = "world_size"
    RANK_SET = "rank_set"
    GPU_MODEL = "gpu_model"
    VERSIONS = "versions"
    STEP_DEFINITION = "step_definition"
    PROFILER = "profiler"
    TRACE_SLICE = "trace_slice"


class ComparabilityIssue(_OnDemand):
    """One way base and head differ that makes their comparison questionable.

    ``refuses_time_verdict``: the difference is large enough (another workload, say) that no
    time verdict may be drawn: the gate answers "inconclusive" and says why.
    """

    aspect: ComparabilityAspect
    base: str
    head: str
    message: str
    refuses_time_verdict: bool = False


class ComparisonReport(_OnDemand):
    """Base vs head: what changed, whether it is significant, and why."""

    schema_version: int = REPORT_SCHEMA_VERSION
    base_label: str
    head_label: str
    helpers: list[HelperDelta]
    span_delta_ns: float  # per step, mean over ranks
    busy_delta_ns: float  # per step, mean over ranks (clipped GPU timeline busy)
    iterations: IterationComparison | None = None
    findings_base: list[Finding] = Field(default_factory=empty_list)
    findings_head: list[Finding] = Field(default_factory=empty_list)
    do_first_head: list[Action] = Field(default_factory=empty_list)
    """The head run's "do this first" (``TraceSummary.do_first``: whole trace)."""
    summary: str  # one line: verdict and the helper(s) behind the difference
    verdict: str
    account: list[AccountDelta] = Field(default_factory=empty_list)
    """Step account of base and head side by side (per step, mean over ranks), largest change
    first."""
    basis: str = "per step, summed over ranks"
    """How helper, kernel and Total GPU numbers were aggregated (per step or whole trace)."""
    kernel_deltas: list[KernelDelta] = Field(default_factory=empty_list)
    total_gpu: GpuTotal | None = None
    ranks: list[RankDelta] = Field(default_factory=empty_list)
    gpu_observed: bool = True
    """False when either side's trace has no GPU activity: its helper, kernel, Total GPU, busy
    and account figures are not observed (the CLI and the page say so instead of zeros)."""
    notes: list[str] = Field(default_factory=empty_list)
    """One line per ``comparability`` issue, then notes that are no issue (a side without GPU
    activity)."""
    comparability: list[ComparabilityIssue] = Field(default_factory=empty_list)
    """The typed comparability check (each issue is also one line of ``notes``)."""
    timeline_base: list[GroupTimeline] = Field(default_factory=empty_list)
    """The base window group's clipped GPU timeline per rank (sums; divide by ``steps``)."""
    timeline_head: list[GroupTimeline] = Field(default_factory=empty_list)
