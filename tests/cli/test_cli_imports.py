"""What ``cptrace analyze`` loads: only what the command needs (issue 28, the CLI's own cost).

Each case runs the real command in a fresh interpreter (an imported module stays imported, so
in-process checks would see the test session's modules) and reports, after the command, the
modules loaded, the process's threads and whether the BLAS variable leaked into the
environment the command's children would inherit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests/data/openworld/kineto_nccl_world1.json.gz"
PAIR = [str(ROOT / f"tests/data/synthetic-h200x2/kineto_rank{rank}.json.gz") for rank in (0, 1)]

_PROBE = """
import json, os, sys
from cptrace.cli import main
sys.argv = ["cptrace", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print(json.dumps({
    "modules": sorted(sys.modules),
    "threads": len(os.listdir("/proc/self/task")),
    "blas_env": os.environ.get("OPENBLAS_NUM_THREADS"),
}), file=sys.stderr)
"""


def _probe(*argv: str, env: dict[str, str] | None = None) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**clean, **(env or {})},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stderr.strip().splitlines()[-1])
    return result


def test_analyze_of_kineto_files_loads_no_multiprocessing() -> None:
    """Without ``CPTRACE_READ_WORKERS`` the files are read in the process itself: the worker
    pool's module is never needed."""
    modules = _probe("analyze", *PAIR, "--report", "findings")["modules"]
    assert isinstance(modules, list)
    assert "numpy" in modules  # it did analyse
    assert "multiprocessing" not in modules


def test_analyze_runs_with_one_blas_thread_and_leaves_the_environment_as_it_was() -> None:
    """numpy is imported with OpenBLAS at one thread (its per-core pool spins at start-up);
    the variable does not stay set for the jobs later commands start."""
    probed = _probe("analyze", str(TRACE), "--report", "findings")
    assert probed["threads"] == 1
    assert probed["blas_env"] is None


def test_a_blas_setting_of_the_user_is_kept() -> None:
    probed = _probe(
        "analyze", str(TRACE), "--report", "findings", env={"OPENBLAS_NUM_THREADS": "2"}
    )
    assert probed["blas_env"] == "2"


def test_help_loads_neither_numpy_nor_pydantic() -> None:
    modules = _probe("--help")["modules"]
    assert isinstance(modules, list)
    assert "numpy" not in modules and "pydantic" not in modules


_MODELS_PROBE = """
import json, sys
from cptrace.cli import main
sys.argv = ["cptrace", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
from analyzers import manifest, report
on_demand = [
    (module.__name__, name) for module in (report, manifest) for name, cls in vars(module).items()
    if isinstance(cls, type) and issubclass(cls, module._OnDemand) and cls is not module._OnDemand
]
built = [f"{m}.{n}" for m, n in on_demand if vars(sys.modules[m])[n].__pydantic_complete__]
print(json.dumps({"on_demand": len(on_demand), "built": built}), file=sys.stderr)
"""


def test_analyze_without_a_manifest_builds_none_of_the_on_demand_models() -> None:
    """The comparison's models and the manifest-only ones are built on first use (pydantic's
    ``defer_build``): an ``analyze`` of traces alone never pays for them."""
    done = subprocess.run(
        [sys.executable, "-c", _MODELS_PROBE, "analyze", *PAIR, "--report", "findings"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    probed = json.loads(done.stderr.strip().splitlines()[-1])
    assert probed["on_demand"] >= 12
    assert probed["built"] == []


HEAVY = (
    "plotly",
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "psycopg",
    "jinja2",
    "httpx",
    "pandas",
    "scipy",
    "web",
    "service",
    "runners",
    "multiprocessing",
    "rich.table",
    "rich.markdown",
    "rich.progress",
    "typer.rich_utils",
)
"""Packages (and modules) that ``cptrace analyze`` of traces to a text report does not need:
the service's and the pages' stacks, data-frame libraries, the worker pool and rich's own
table/markdown/progress engines (the command's tables are ``cptrace.commands._tables``;
the progress bar is drawn only on a terminal). numpy and pydantic are needed: the analysis
computes with numpy arrays and its report is pydantic models (typer imports pydantic too)."""


def _heavy(modules: object) -> list[str]:
    assert isinstance(modules, list)
    return sorted(m for m in modules for heavy in HEAVY if m == heavy or m.startswith(f"{heavy}."))


def test_analyze_loads_none_of_the_heavy_modules() -> None:
    """A text report, a JSON report and a CSV report of a two-rank pair: none of them imports
    a module of :data:`HEAVY`, so the CLI's own start-up cost cannot creep back through an
    import at the top of a module the command loads."""
    for extra in ([], ["--report", "findings"], ["--json"], ["--format", "csv"]):
        modules = _probe("analyze", *PAIR, *extra)["modules"]
        assert "numpy" in _as_list(modules)  # it did analyse
        assert _heavy(modules) == [], extra


def test_the_heavy_module_check_names_a_heavy_module_and_its_submodules_only() -> None:
    """The filter of the check above matches a heavy package and its submodules, not a
    module whose name only starts the same (``webbrowser`` is not ``web``)."""
    loaded = ["numpy", "rich", "rich.table", "richer", "web.app", "webbrowser", "service"]
    assert _heavy(loaded) == ["rich.table", "service", "web.app"]


def _as_list(modules: object) -> list[str]:
    assert isinstance(modules, list)
    return modules
