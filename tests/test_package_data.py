"""Every file a non-editable install needs is in the wheel.

setuptools ships the modules of Python packages (directories with ``__init__.py``) and, of
everything else, only what ``[tool.setuptools.package-data]`` names. A data directory that is
not a package (the catalog, the templates, ``cptrace profile``'s ``bootstrap/`` with its
``sitecustomize.py``) silently disappears from a wheel unless a glob covers each of its files,
which only shows on a user's machine.
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Files inside the packages that only a source checkout uses, never an installed cptrace.
CHECKOUT_ONLY = {
    "runners/gpu_capture.sh": "captures the demo bundles from the repository root on a GPU host",
}


def _setuptools_config() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _shipped_by_glob(package: str, relative: str, globs: dict[str, list[str]]) -> bool:
    return any(
        fnmatch.fnmatch(relative, g) or fnmatch.fnmatch(relative, g.replace("**/", ""))
        for g in globs.get(package, [])
    )


def test_every_file_outside_python_packages_is_package_data() -> None:
    config = _setuptools_config()
    tops = [p.rstrip("*") for p in config["packages"]["find"]["include"]]
    globs: dict[str, list[str]] = config["package-data"]
    missing = []
    for top in tops:
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            in_package = (path.parent / "__init__.py").exists()
            if in_package and path.suffix == ".py":
                continue  # a module: shipped as code
            relative = path.relative_to(ROOT / top).as_posix()
            if f"{top}/{relative}" in CHECKOUT_ONLY:
                continue
            if not _shipped_by_glob(top, relative, globs):
                missing.append(f"{top}/{relative}")
    assert missing == [], f"not in [tool.setuptools.package-data]: {missing}"


def test_profile_bootstrap_is_shipped() -> None:
    """The failure this test exists for: the child's sitecustomize must be in the wheel."""
    config = _setuptools_config()
    assert _shipped_by_glob("runners", "profile/bootstrap/sitecustomize.py", config["package-data"])
