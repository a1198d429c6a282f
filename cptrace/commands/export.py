"""``cptrace export perfetto``: one analysed window as Chrome trace-event JSON (Perfetto UI).

A thin wrapper over ``analyzers.export.perfetto``; library errors become one ``Error:`` line.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cptrace.commands._numpy import import_numpy
from cptrace.commands.analyze import _catalog, _fail, _library_errors

export_app = typer.Typer(
    help="Write what cptrace measured in other tools' formats.", no_args_is_help=True
)


@export_app.command("perfetto")
def perfetto(
    traces: list[Path] = typer.Argument(
        ..., help="Trace files (Kineto JSON per rank, nsys .sqlite[.gz]/.nsys-rep) or a run bundle."
    ),
    window: str = typer.Option(
        ...,
        "--window",
        "-w",
        help="Window name (ProfilerStep#3) or group (arm:auto_clone), '#N' for its N-th window.",
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the JSON."),
    manifest: Path | None = typer.Option(
        None, "--manifest", "-m", help="Run manifest JSON (names the A/B windows)."
    ),
    step_pattern: str | None = typer.Option(
        None, "--step-pattern", help="Regex for step range names (default ProfilerStep#N)."
    ),
    catalog: list[Path] | None = typer.Option(
        None, "--catalog", help="Extra helper catalog TOML (repeatable)."
    ),
) -> None:
    """Write one window of the analysis as Chrome trace-event JSON for ui.perfetto.dev.

    Tracks per rank: a GPU process with one track per stream plus "idle gaps (cptrace
    account)", and a CPU process with the launching threads' launch calls and catalogued
    ranges. Each activity's args carry its helper, category and account part; every slice lies
    inside its rank's window. Open the file at https://ui.perfetto.dev ("Open trace file") or
    in chrome://tracing ("Load").

    Example: cptrace export perfetto run.tar --window arm:auto_clone#1 -o step.json
    """
    import re

    import_numpy()
    from analyzers.export.perfetto import ExportError, perfetto_trace
    from analyzers.pipeline import run_analysis

    expected: tuple[type[BaseException], ...] = (*_library_errors(), ExportError)
    try:
        if step_pattern:
            re.compile(step_pattern)
        cat = _catalog(catalog)
        an = run_analysis(traces, manifest=manifest, step_pattern=step_pattern, catalog=cat)
        doc = perfetto_trace(an.trace, an.attribution, an.ranges, cat, an.report.windows, window)
        output.write_text(json.dumps(doc), encoding="utf-8")
    except expected as exc:
        raise _fail(exc) from exc
    slices = sum(1 for e in doc["traceEvents"] if e["ph"] == "X")
    typer.echo(f"wrote {output}: {slices} slices of window {window!r}")


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
