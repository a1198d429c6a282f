"""``analyze``: trace files (or a run bundle) in, one :class:`AnalysisReport` out.

read -> match ranges once -> attribute -> windows -> metrics -> iteration stats -> findings.
Each stage is a pure function of the previous ones; this module only wires them and reports
progress, so the service worker, the CLI and the benchmarks run exactly the same code.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from analyzers.account import compute_accounts
from analyzers.attribution import Attribution, RangeHelpers, attribute, match_ranges
from analyzers.catalog import Catalog, load_catalog
from analyzers.errors import (
    CorruptTraceError,
    RankConflictError,
    TraceError,
    UnsupportedTraceError,
)
from analyzers.findings import evaluate
from analyzers.findings.observed import uncited_observations
from analyzers.findings.padding import idle_statement
from analyzers.findings.summary import summarize
from analyzers.host_time import host_time
from analyzers.manifest import FailureRecord, RunManifest, load_manifest
from analyzers.metrics import Metrics, compute_metrics
from analyzers.model import (
    ACTIVITY_DTYPE,
    LAUNCH_DTYPE,
    RANGE_DTYPE,
    SymbolTable,
    Trace,
    launch_calls,
    merge_traces,
)
from analyzers.readers import DEFAULT_MAX_DECOMPRESSED, TraceInput
from analyzers.report import (
    AnalysisReport,
    DeviceFigures,
    Finding,
    IterationStats,
    RunEnvironment,
    SourceInfo,
)
from analyzers.run_identity import (
    job_command,
    profilers,
    run_workload,
    trace_slices,
    variant_workloads,
)
from analyzers.stats import iteration_stats
from analyzers.timeline_gaps import drawn_windows, timeline_gaps
from analyzers.windows import WHOLE_TRACE, choose_steps, find_windows
from contracts.validation import first_error

if TYPE_CHECKING:
    from analyzers.bundle import Bundle

Progress = Callable[[str, float], None]
"""Called with a stage description and the fraction of the work done (0..1)."""

PathLike = str | Path
Inputs = Sequence[PathLike | TraceInput] | PathLike | TraceInput
"""What ``analyze`` takes: paths (traces, run bundles, a saved report) and typed inputs."""


@dataclass(slots=True)
class Analysis:
    """The intermediate results, for callers (tests, benchmarks) that need more than the report."""

    trace: Trace
    ranges: RangeHelpers
    attribution: Attribution
    metrics: Metrics
    report: AnalysisReport


class FailedRunError(TraceError):
    """A run bundle holds no traces because its job failed before writing any.

    The message says so in one line with the failure summary (failed rank, exception);
    ``findings`` are what the manifest alone supports (e.g. a token count that FP8 cannot
    take, the usual cause of such a failure), for the caller to show next to the error.
    """

    def __init__(
        self,
        message: str,
        findings: Sequence[Finding] = (),
        failure: FailureRecord | None = None,
    ) -> None:
        super().__init__(message)
        self.findings = list(findings)
        self.failure = failure


def _expand(
    paths: Sequence[PathLike | TraceInput],
    manifest: RunManifest | PathLike | None,
    stack: ExitStack,
) -> tuple[list[TraceInput], RunManifest | None]:
    """The typed inputs: run bundles replaced by their traces (a bundle's manifest is used
    unless one is given), bare paths sniffed once, ``TraceInput`` items kept as they are.

    Bundles are entered on ``stack`` so a tar's extraction directory is removed afterwards.
    A bundle trace is labelled for output ``run.tar.gz:traces/rank0.json.gz`` (never the
    extraction directory, which is gone once the analysis ends).
    """
    from analyzers.readers import trace_input

    files: list[TraceInput] = []
    bundle_manifest = None
    for raw in paths:
        if isinstance(raw, TraceInput):
            files.append(raw)
            continue
        path = Path(raw)
        bundle = _open_bundle(path)
        if bundle is None:
            files.append(trace_input(path))
            continue
        stack.enter_context(bundle)
        found = [t.as_input(label=f"{path.name}:{t.member}") for t in bundle.analysis_traces()]
        if not found and len(paths) == 1:
            _refuse_empty_bundle(path, bundle.manifest)
        files.extend(found)
        bundle_manifest = bundle_manifest or bundle.manifest
    if manifest is None:
        return files, bundle_manifest
    return files, manifest if isinstance(manifest, RunManifest) else load_manifest(manifest)


def _refuse_empty_bundle(path: Path, manifest: RunManifest | None) -> None:
    """A bundle without traces: say why in one line (the job's failure, when it failed)."""
    failure = manifest.failure if manifest else None
    if manifest is None or failure is None:
        raise TraceError(f"{path}: the run bundle holds no traces")
    exception = failure.exception or {}
    what = failure.summary
    if not what and exception:
        what = f"rank {failure.failed_rank} raised {exception.get('type')}: "
        what += str(exception.get("message"))
    what = " ".join((what or "no failure summary recorded").split())
    raise FailedRunError(
        f"{path}: no traces: the job failed before writing any ({what})",
        manifest_findings(manifest),
        failure,
    )


def manifest_findings(manifest: RunManifest, catalog: Catalog | None = None) -> list[Finding]:
    """The findings a run's manifest supports on its own, for a run that left no trace.

    The rules run on an empty trace judged as one whole-trace group: the workload rules (token
    alignment, divisibility, ...) read only the manifest; the trace rules find nothing to say.
    """
    empty = Trace(
        source="(no trace)",
        format="none",
        strings=SymbolTable(),
        activities=np.empty(0, dtype=ACTIVITY_DTYPE),
        launches=np.empty(0, dtype=LAUNCH_DTYPE),
        ranges=np.empty(0, dtype=RANGE_DTYPE),
    )
    catalog = catalog or load_catalog()
    ranges = match_ranges(empty, catalog)
    att = attribute(empty, catalog, ranges)
    metrics = compute_metrics(empty, att, ranges, catalog, [])
    metrics.groups = [WHOLE_TRACE]
    return evaluate(metrics, manifest, catalog=catalog)


def _open_bundle(path: Path) -> Bundle | None:
    """The bundle at ``path`` if it is one, else None."""
    from analyzers.bundle import is_bundle, read_bundle

    return read_bundle(path) if is_bundle(path) else None


def _read(
    files: Sequence[TraceInput],
    progress: Progress | None,
    rank: int | None = None,
    *,
    max_decompressed_bytes: int,
) -> tuple[Trace, list[SourceInfo]]:
    from analyzers.readers import read_inputs

    if not files:
        raise TraceError("no trace files given")
    if progress:
        progress(f"reading {', '.join(f.path.name for f in files)}", 0.0)
    # one call for all files: per-rank Kineto files can be read in parallel workers
    traces = read_inputs(files, rank=rank, max_decompressed_bytes=max_decompressed_bytes)
    sources = source_infos(traces, files)
    return merge_traces(traces), sources


def source_infos(traces: Sequence[Trace], files: Sequence[TraceInput]) -> list[SourceInfo]:
    """What each file brought (``AnalysisReport.sources``), ranks resolved.

    :raises RankConflictError: two files claim one rank.
    """
    claimed: dict[int, str] = {}
    return [source_info(trace, item, claimed) for item, trace in zip(files, traces, strict=True)]


def source_info(trace: Trace, item: TraceInput, claimed: dict[int, str]) -> SourceInfo:
    """One file's ``SourceInfo``; its ranks join ``claimed`` (rank -> path), file by file, so
    the per-rank merge can take its parts one at a time.

    :raises RankConflictError: the file claims a rank already in ``claimed``.
    """
    ranks = [r for r in trace.rank_list() if r >= 0]
    for found in ranks:
        if found in claimed:
            raise RankConflictError(
                f"{item.path}: rank {found} is also claimed by {claimed[found]}"
            )
        claimed[found] = str(item.path)
    return SourceInfo(
        path=item.name,
        format=trace.format,
        ranks=ranks,
        activities=len(trace.activities),
        launches=int(launch_calls(trace.launches).sum()),
        ranges=len(trace.ranges),
        notes=list(trace.notes),
    )


TIMED = "timed"
PROFILED = "profiled"


def _iterations(manifest: RunManifest | None, metrics: Metrics) -> list[IterationStats]:
    """Iteration times from the manifest's CUDA-event timings, else from window durations.

    Timed iterations (``source="timed"``) come first; a group without them gets the durations
    of its profiled windows (``source="profiled"``): those ran under the profiler and are
    several-fold slower with Python stacks, so rules never take savings from them.
    The all-ranks row (``rank=None``) takes the slowest rank per iteration when every rank has
    the same number of samples (a step ends when its slowest rank does); else it pools them.
    A variant without a window is the whole job (``cptrace profile`` times every step of it):
    its timed iterations belong to the trace's one step group, or to the whole trace when the
    trace marks no steps.
    """
    steps = [g for g in metrics.groups if g != WHOLE_TRACE]
    whole_job = steps[0] if len(steps) == 1 else WHOLE_TRACE if not steps else None
    measured: dict[str, dict[int, list[float]]] = {}
    if manifest is not None:
        for variant in manifest.variants:
            if variant.iteration_ms:
                group = variant.window or whole_job or variant.name
                measured[group] = {int(r): list(v) for r, v in variant.iteration_ms.items()}
    from_windows: dict[str, dict[int, list[float]]] = {}
    for (rank, group), durations in metrics.durations_ms.items():
        if group != WHOLE_TRACE and group not in measured:
            from_windows.setdefault(group, {})[rank] = durations
    out = []
    sources = [(TIMED, measured), (PROFILED, from_windows)]
    for source, groups in sources:
        for group, by_rank in groups.items():
            by_rank = {r: v for r, v in by_rank.items() if v}
            if not by_rank:
                continue
            out += [
                iteration_stats(group, v, rank=r, source=source) for r, v in sorted(by_rank.items())
            ]
            if len({len(v) for v in by_rank.values()}) == 1:
                combined = np.max(np.array(list(by_rank.values())), axis=0).tolist()
            else:
                combined = [x for v in by_rank.values() for x in v]
            out.append(iteration_stats(group, combined, rank=None, source=source))
    return out


def _world_size(trace: Trace) -> int | None:
    """Largest ``distributedInfo.world_size`` of the trace or of the files merged into it."""
    parts = trace.metadata.get("parts")
    infos = [trace.metadata, *(parts if isinstance(parts, list) else [])]
    sizes = [
        info["distributedInfo"].get("world_size")
        for info in infos
        if isinstance(info, dict) and isinstance(info.get("distributedInfo"), dict)
    ]
    sizes = [s for s in sizes if isinstance(s, int)]
    return max(sizes) if sizes else None


def _environment(
    trace: Trace,
    manifest: RunManifest | None,
    ranks: Sequence[int],
    sources: Sequence[SourceInfo] = (),
    devices: Sequence[DeviceFigures] = (),
) -> RunEnvironment:
    """GPU models from the traces (Kineto ``deviceProperties``, nsys ``TARGET_INFO_GPU``), world
    size from ``distributedInfo`` (else the ranks seen), versions from the manifest; what ran
    and how it was captured from ``analyzers.run_identity``."""
    parts = trace.metadata.get("parts")
    infos = [trace.metadata, *(parts if isinstance(parts, list) else [])]
    models: set[str] = set()
    for info in infos:
        if isinstance(info, dict):
            for key in ("device_names", "gpus"):
                names = info.get(key)
                if isinstance(names, list):
                    models.update(str(n) for n in names if n)
    env = manifest.environment if manifest else {}
    listed = env.get("gpu_models")
    if not models and isinstance(listed, list):
        models.update(str(n) for n in listed)

    def version(key: str) -> str | None:
        value = env.get(key)
        return str(value) if value else None

    return RunEnvironment(
        gpu_models=sorted(models),
        world_size=_world_size(trace) or (len([r for r in ranks if r >= 0]) or None),
        torch=version("torch"),
        transformer_engine=version("transformer_engine"),
        cudnn=version("cudnn"),
        workload=run_workload(manifest),
        command=job_command(manifest),
        variants=variant_workloads(manifest),
        profilers=profilers(trace, sources),
        trace_slices=trace_slices(trace, manifest, devices),
    )


def _notes(
    trace: Trace,
    manifest: RunManifest | None,
    metrics: Metrics,
    iterations: Sequence[IterationStats] = (),
) -> list[str]:
    """What the report cannot cover: reader notes, empty input, missing windows or ranks,
    iteration times that only come from profiled steps."""
    notes = list(trace.notes) + list(metrics.notes)
    profiled = [it.label for it in iterations if it.rank is None and it.source == PROFILED]
    if profiled:
        notes.append(
            f"no timed iterations for {', '.join(profiled)}: their iteration times are durations "
            f"of profiled steps (inflated by the profiler); add iteration_ms to the manifest"
        )
    if len(trace.activities) == 0:
        notes.append("the traces hold no GPU activity: nothing to attribute")
    variants = manifest.variants if manifest else []
    notes += [
        f"manifest window {v.window!r} not found in the traces"
        for v in variants
        if v.window and v.window not in metrics.groups
    ]
    present = set(trace.rank_list())
    expected = {int(r) for v in variants for r in v.iteration_ms}
    world = _world_size(trace)
    if world is not None:
        expected |= set(range(world))
    missing = sorted(expected - present)
    if missing:
        notes.append(
            f"rank(s) {missing} missing from the traces: cross-rank numbers cover "
            f"{sorted(present)} only"
        )
    return notes


@contextmanager
def _cycle_collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for one analysis, then restore it as it was.

    Why: an analysis builds 10^5-10^6 container objects that all stay alive until the report
    is built (model rows, per-window tables); every collection of the oldest generation walks
    all of them, and the imported modules, and finds nearly nothing (a few hundred unreachable
    objects after a whole analysis of the real nsys export). Measured with ``gc.callbacks``
    (CPU seconds inside the collector): about 0.05 s of a 0.45 s analysis of the real nsys
    export, 0.36 s of the Kineto pair x10, 0.8 s at 2M kernels. Reference counting still
    frees everything that is not in a cycle, so memory does not grow. On the way out the
    young generation is collected here (the collection the next allocation would trigger, as
    the objects allocated meanwhile are all counted as young): its cost stays inside the
    analysis. Process-wide: callers run one analysis per process (the CLI, the service's
    isolated worker) or in one thread.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
            gc.collect(0)


def analyze_trace(
    trace: Trace,
    *,
    manifest: RunManifest | None = None,
    step_pattern: str | None = None,
    catalog: Catalog | None = None,
    sources: Sequence[SourceInfo] = (),
    progress: Progress | None = None,
) -> Analysis:
    """Analyze an already-read trace (the stages after the readers)."""
    with _cycle_collector_paused():
        return _analyze_trace(
            trace,
            manifest=manifest,
            step_pattern=step_pattern,
            catalog=catalog,
            sources=sources,
            progress=progress,
        )


def _analyze_trace(
    trace: Trace,
    *,
    manifest: RunManifest | None,
    step_pattern: str | None,
    catalog: Catalog | None,
    sources: Sequence[SourceInfo],
    progress: Progress | None,
) -> Analysis:
    catalog = catalog or load_catalog()
    if progress:
        progress("attributing", 0.6)
    ranges = match_ranges(trace, catalog)
    att = attribute(trace, catalog, ranges)
    return analyze_attributed(
        trace,
        ranges,
        att,
        manifest=manifest,
        step_pattern=step_pattern,
        catalog=catalog,
        sources=sources,
        progress=progress,
    )


def analyze_attributed(
    trace: Trace,
    ranges: RangeHelpers,
    att: Attribution,
    *,
    manifest: RunManifest | None,
    step_pattern: str | None,
    catalog: Catalog,
    sources: Sequence[SourceInfo],
    progress: Progress | None,
) -> Analysis:
    """The stages after attribution: windows, metrics, accounts, findings, the report.

    Shared by the one-process analysis and the merge of per-rank parts
    (``analyzers.rank_parts``), which attribute each file on its own.
    """
    window_names = [v.window for v in manifest.variants if v.window] if manifest else []
    steps = choose_steps(trace, step_pattern, exclude=lambda n: catalog.match_range(n)[0] >= 0)
    windows = find_windows(trace, step_pattern, window_names, steps=steps)
    if progress:
        progress("metrics", 0.8)
    steps_per_window = {
        v.window: v.steps_per_window
        for v in (manifest.variants if manifest else [])
        if v.window and v.steps_per_window
    }
    metrics = compute_metrics(
        trace, att, ranges, catalog, windows, steps_per_window=steps_per_window
    )
    iterations = _iterations(manifest, metrics)
    if metrics.gpu is None:  # compute_metrics always sets it
        raise RuntimeError("metrics without a GPU timeline")
    drawn_timelines = ([metrics.timeline] if metrics.timeline else []) + metrics.other_timelines
    accounts = compute_accounts(
        trace,
        att,
        ranges,
        catalog,
        windows,
        metrics.steps,
        metrics.gpu,
        keep=drawn_windows(windows, drawn_timelines),  # the pieces timeline_gaps asks for
        syncs=metrics.syncs,
    )
    hosted = host_time(trace, ranges, catalog, windows, metrics.steps)
    findings = idle_statement(
        evaluate(metrics, manifest, catalog=catalog, iterations=iterations, host_time=hosted),
        accounts.groups,
        catalog,
    )
    ranks = [r for r in trace.rank_list() if r >= 0] or trace.rank_list()
    timelines = [metrics.timeline] if metrics.timeline else []
    drawn = timeline_gaps(
        trace,
        att,
        ranges,
        catalog,
        windows,
        timelines + metrics.other_timelines,
        pieces_of=accounts.pieces,
    )
    report = AnalysisReport(
        catalog_version=f"{catalog.name}-{catalog.version}",
        sources=list(sources),
        ranks=ranks,
        windows=windows,
        helpers=metrics.helpers,
        streams=metrics.streams,
        rank_summaries=metrics.rank_summaries,
        imbalance=metrics.imbalance,
        iterations=iterations,
        findings=findings,
        timeline=drawn[0] if drawn else None,
        other_timelines=drawn[1:],
        notes=_notes(trace, manifest, metrics, iterations)
        + ([steps.note] if steps.note else [])
        + accounts.notes
        + uncited_observations(manifest, findings),
        host_syncs=metrics.host_syncs,
        groups=metrics.groups,
        host_time=hosted,
        summary=summarize(
            trace,
            att,
            ranges,
            catalog,
            findings,
            syncs=metrics.syncs,
            acts=metrics.gpu.acts,
            windows=windows,
            sync_lines=manifest.sync_lines if manifest else (),
        ),
        gpu_timeline=metrics.gpu_timeline,
        window_timelines=metrics.window_timelines,
        accounts=accounts.groups,
        step_accounts=accounts.steps,
        devices=metrics.devices,
        kernels=metrics.kernels,
        environment=_environment(trace, manifest, ranks, sources, metrics.devices),
        failure=manifest.failure if manifest else None,
    )
    if progress:
        progress("done", 1.0)
    return Analysis(trace, ranges, att, metrics, report)


def run_analysis(
    paths: Inputs,
    *,
    manifest: RunManifest | PathLike | None = None,
    step_pattern: str | None = None,
    catalog: Catalog | None = None,
    progress: Progress | None = None,
    rank: int | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
) -> Analysis:
    """Like :func:`analyze` but returns the intermediate arrays too."""
    items = _items(paths)
    with _cycle_collector_paused():
        catalog = catalog or load_catalog()
        with ExitStack() as stack:
            files, manifest_obj = _expand(items, manifest, stack)
            trace, sources = _read(
                files, progress, rank, max_decompressed_bytes=max_decompressed_bytes
            )
        return analyze_trace(
            trace,
            manifest=manifest_obj,
            step_pattern=step_pattern,
            catalog=catalog,
            sources=sources,
            progress=progress,
        )


def analyze(
    paths: Inputs,
    *,
    manifest: RunManifest | PathLike | None = None,
    step_pattern: str | None = None,
    catalog: Catalog | None = None,
    progress: Progress | None = None,
    rank: int | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
) -> AnalysisReport:
    """Analyze trace files (Kineto JSON per rank, nsys exports) or run bundles.

    Paths are sniffed (once each) to tell formats apart; a ``TraceInput`` says its format, so
    the readers take it as it is.

    :param manifest: a ``RunManifest`` or the path of one (a bundle brings its own).
    :param step_pattern: regex for step ranges (default ``ProfilerStep#N``).
    :param catalog: helper catalog (default: built-in plus ``$CPTRACE_CATALOG``).
    :param progress: callback ``(stage, fraction)``.
    :param rank: the rank of a single trace file that does not say its own (default: what the
        file says, else rank 0 with a note).
    :param max_decompressed_bytes: the most a gzipped trace may expand to (the service passes
        its ``Settings`` cap; default ``readers.DEFAULT_MAX_DECOMPRESSED``).

    A saved report (``cptrace analyze --json`` output, recognised by content like a trace) is
    accepted wherever a trace is: given alone, it is validated and returned as is.

    :raises TraceError: unreadable or conflicting traces (see ``analyzers.errors``).
    :raises ManifestError: an invalid manifest file.
    """
    items = _typed(_items(paths))
    saved = saved_report(items)
    if saved is not None:
        return saved
    return run_analysis(
        items,
        manifest=manifest,
        step_pattern=step_pattern,
        catalog=catalog,
        progress=progress,
        rank=rank,
        max_decompressed_bytes=max_decompressed_bytes,
    ).report


def _items(paths: Inputs) -> list[PathLike | TraceInput]:
    return [paths] if isinstance(paths, str | Path | TraceInput) else list(paths)


def _typed(items: Sequence[PathLike | TraceInput]) -> list[PathLike | TraceInput]:
    """Bare trace files as typed inputs, each sniffed once; bundles and saved reports (and
    paths that are no file, for the readers to refuse) stay as they are."""
    from analyzers.bundle import is_bundle
    from analyzers.readers import sniff_input

    out: list[PathLike | TraceInput] = []
    for raw in items:
        if isinstance(raw, TraceInput) or not Path(raw).is_file() or is_bundle(raw):
            out.append(raw)
        else:
            out.append(sniff_input(raw) or Path(raw))  # a saved report stays a path
    return out


def saved_report(paths: Inputs) -> AnalysisReport | None:
    """The report when ``paths`` is one saved ``AnalysisReport`` file (gzipped or not, any
    name), None when no path is one; a report among other files is an error (it stands for a
    whole run, its traces are not there to merge)."""
    from pydantic import ValidationError

    from analyzers.bundle import is_bundle
    from analyzers.readers import CappedGunzip, is_gzip, sniff

    def is_report(path: Path) -> bool:
        if not path.is_file() or is_bundle(path):
            return False
        try:
            return sniff(path) == "report"
        except TraceError:  # not a report; the readers say what it is not
            return False

    items = _items(paths)
    # a typed input is a trace (its format says which): only bare paths may be a report
    reports = [Path(p) for p in items if not isinstance(p, TraceInput) and is_report(Path(p))]
    if not reports:
        return None
    if len(items) > 1:
        raise UnsupportedTraceError(
            f"{reports[0]}: is a saved cptrace report; give it alone (it stands for a whole "
            "run), not together with other traces"
        )
    path = reports[0]
    with path.open("rb") as raw:
        data = (
            CappedGunzip(raw, DEFAULT_MAX_DECOMPRESSED, label=str(path)).read()
            if is_gzip(path)
            else raw.read()
        )
    try:
        return AnalysisReport.model_validate_json(data)
    except ValidationError as exc:
        first = first_error(exc)
        raise CorruptTraceError(f"{path}: not a valid cptrace report: field {first}") from exc


__all__ = [
    "Analysis",
    "Inputs",
    "Progress",
    "analyze",
    "analyze_attributed",
    "analyze_trace",
    "run_analysis",
    "saved_report",
    "source_info",
    "source_infos",
]
