"""What a run ran and how it was captured: the facts ``analyzers.comparability`` compares.

The pipeline records them on ``AnalysisReport.environment`` (``RunEnvironment``) so that a
stored report can be checked against another without its manifest or traces: the workload
(the manifest's, each variant's with its overrides, or the command of a ``cptrace profile``
run), the profilers behind the traces, and how the traces are cut short of the run.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from analyzers.manifest import RunManifest, Workload
from analyzers.model import Trace
from analyzers.report import DeviceFigures, SourceInfo, VariantWorkload


def _metadata_parts(trace: Trace) -> list[dict[str, object]]:
    """The reader metadata of every file merged into ``trace`` (the trace's own when one)."""
    parts = trace.metadata.get("parts")
    infos = [trace.metadata, *(parts if isinstance(parts, list) else [])]
    return [info for info in infos if isinstance(info, dict)]


def run_workload(manifest: RunManifest | None) -> Workload | None:
    """The manifest's workload, None when there is none or it is empty."""
    if manifest is None:
        return None
    fields = manifest.workload.model_dump(exclude_none=True)
    return manifest.workload if fields else None


def variant_workloads(manifest: RunManifest | None) -> list[VariantWorkload]:
    """Each windowed variant's effective workload and the fields it overrides."""
    if manifest is None:
        return []
    return [
        VariantWorkload(
            window=v.window,
            variant=v.name,
            workload=manifest.effective_workload(v),
            overrides=sorted(v.workload),
        )
        for v in manifest.variants
        if v.window
    ]


def _run_block(manifest: RunManifest | None) -> dict[str, object]:
    run = (manifest.model_extra or {}).get("run") if manifest is not None else None
    return run if isinstance(run, dict) else {}


def job_command(manifest: RunManifest | None) -> str | None:
    """The job's own command line of a ``cptrace profile`` run (``run.spec.command``)."""
    spec = _run_block(manifest).get("spec")
    command = spec.get("command") if isinstance(spec, dict) else None
    if isinstance(command, list) and command:
        return shlex.join(str(c) for c in command)
    return command if isinstance(command, str) and command else None


def profilers(trace: Trace, sources: Sequence[SourceInfo]) -> list[str]:
    """The profilers behind the traces; Kineto with Python stacks is its own kind (the stacks
    inflate host time several-fold)."""
    stacks = any(
        str(info.get("with_stack", "")).lower() in ("1", "true") for info in _metadata_parts(trace)
    )
    formats = {s.format for s in sources} or ({trace.format} if trace.format != "none" else set())
    return sorted(f"{f} with Python stacks" if f == "kineto" and stacks else f for f in formats)


def trace_slices(
    trace: Trace, manifest: RunManifest | None, devices: Sequence[DeviceFigures]
) -> list[str]:
    """How the traces are cut short of the run, one line each (empty: not cut).

    Three signs: an nsys export limited to time ranges (``nsys export --times``, recorded by
    the reader as ``export_times``), an nsys capture limited by delay/duration (the profile
    spec), and kernels whose launch row is missing (the cut fell between a launch and its
    kernel).
    """
    out = [
        f"nsys export limited to the time range(s) {info['export_times']}"
        for info in _metadata_parts(trace)
        if info.get("export_times")
    ]
    spec = _run_block(manifest).get("spec")
    profile = spec.get("profile") if isinstance(spec, dict) else None
    capture = profile.get("nsys_capture") if isinstance(profile, dict) else None
    if isinstance(capture, dict):
        cut = [
            text.format(capture[key])
            for key, text in (("delay_s", "delayed {} s"), ("duration_s", "{} s long"))
            if capture.get(key) is not None
        ]
        if cut:
            out.append(f"nsys capture {', '.join(cut)}")
    out += [
        f"rank {d.rank}: {d.kernels_without_launch} of {d.kernels} kernels without their launch "
        "(the capture or export cut launches off)"
        for d in devices
        if d.kernels_without_launch
    ]
    return sorted(set(out), key=out.index)


__all__ = ["job_command", "profilers", "run_workload", "trace_slices", "variant_workloads"]
