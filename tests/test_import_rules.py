"""The house's import rules, read from the source (every import statement, also inside functions).

- Data flows one way: ``service`` imports neither ``web`` nor the CLI (``cptrace``) nor the
  runners; ``contracts`` imports nothing of ours, ``analyzers`` only ``contracts``; ``web`` does not
  import the CLI or the runners; ``pr_bot`` imports only ``analyzers`` (and ``contracts``);
  ``runners`` (with the probe, ``runners.profile.probe``) imports neither the CLI, nor the
  service, nor the pages, nor the PR bot.
  The served app is assembled in ``cptrace/app.py``.
- A private module (``_name``) belongs to its package: only modules inside that package import it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

REPO = Path(__file__).resolve().parent.parent
PACKAGES = (
    "analyzers", "contracts", "service", "web", "cptrace", "runners", "cp_attention", "pr_bot",
)  # fmt: skip
FORBIDDEN = {
    "service": {"web", "cptrace", "runners"},
    # contracts sits below everyone (the one validation-error formatter, the spec)
    "analyzers": {"service", "web", "cptrace", "runners", "cp_attention", "pr_bot"},
    "contracts": {"analyzers", "service", "web", "cptrace", "runners", "cp_attention"},
    "web": {"cptrace", "runners"},
    # the PR bot (comment, policy, GitHub client) sits below service, web and the CLI
    "pr_bot": {"service", "web", "cptrace", "runners", "cp_attention"},
    # the runners (and the probe they load in every rank) sit below the CLI and the service
    "runners": {"cptrace", "service", "web", "pr_bot"},
}


def _modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), path


def _imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """``(line, imported module)`` for every import in the file; relative ones resolved."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:  # ``from pkg import _private_module``
                yield node.lineno, f"{base}.{alias.name}"


@cache
def _repo_imports() -> dict[str, tuple[Path, tuple[tuple[int, str], ...]]]:
    """module -> (its file, its imports) for every module of ours, parsed once for all the rules
    below (each rule re-parsing the whole repository took seconds of CPU)."""
    return {module: (path, tuple(_imports(module, path))) for module, path in _modules()}


def _repo_imports_of(module: str, path: Path) -> Iterable[tuple[int, str]]:
    return _repo_imports()[module][1]


def _private_owner(imported: str) -> str | None:
    """The package that owns ``imported`` if it names a private module of ours, else None."""
    parts = imported.split(".")
    if parts[0] not in PACKAGES:
        return None
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not part.startswith("__"):
            candidate = REPO.joinpath(*parts[:i], part)
            if candidate.with_suffix(".py").is_file() or (candidate / "__init__.py").is_file():
                return ".".join(parts[:i])
            return None  # a private name inside a module, not a module
    return None


def test_lower_rooms_never_import_higher_ones() -> None:
    found = []
    for module, (path, imports) in _repo_imports().items():
        banned = FORBIDDEN.get(module.split(".")[0], set())
        for line, imported in imports:
            if imported.split(".")[0] in banned:
                found.append(f"{path.relative_to(REPO)}:{line}: imports {imported}")
    assert not found, "imports against the flow:\n" + "\n".join(sorted(set(found)))


ACYCLIC = ("service", "web", "pr_bot", "runners", "contracts")
"""Rooms whose modules import each other without a cycle (a cycle hides a second home: the
supervisor started the validation pool it was used by)."""


def _module_cycles(
    modules: dict[str, Path],
    imports_of: Callable[[str, Path], Iterable[tuple[int, str]]] = _imports,
) -> list[list[str]]:
    """Strongly connected groups of ``modules`` (every import, also inside functions)."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        graph[module] = set()
        for _, imported in imports_of(module, path):
            parts = imported.split(".")
            for k in range(len(parts), 0, -1):  # the longest name that is one of our modules
                target = ".".join(parts[:k])
                if target in modules:
                    if target != module:
                        graph[module].add(target)
                    break
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_module_import_cycle_above_analyzers() -> None:
    modules = {m: p for m, (p, _) in _repo_imports().items() if m.split(".")[0] in ACYCLIC}
    cycles = _module_cycles(modules, _repo_imports_of)
    assert not cycles, "module import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_can_fail(tmp_path: Path) -> None:
    """A cycle through an import inside a function counts (the supervisor's was one)."""
    (tmp_path / "a.py").write_text("from service.b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from service import a\n")
    (tmp_path / "c.py").write_text("import service.a\n")
    modules = {f"service.{n}": tmp_path / f"{n}.py" for n in "abc"}
    assert _module_cycles(modules) == [["service.a", "service.b"]]


def test_no_package_imports_another_packages_private_module() -> None:
    found = []
    for module, (path, imports) in _repo_imports().items():
        for line, imported in imports:
            owner = _private_owner(imported)
            if owner is not None and not (module == owner or module.startswith(owner + ".")):
                found.append(f"{path.relative_to(REPO)}:{line}: imports {imported} ({owner}'s)")
    assert not found, "private modules used from outside:\n" + "\n".join(sorted(set(found)))


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("service.x", "from web.routes import router", "web.routes"),
        ("service.x", "def f():\n    import cptrace\n", "cptrace"),
        ("analyzers.a.b", "from .._files import x", "analyzers._files"),
        ("analyzers.a", "from analyzers.readers import _files", "analyzers.readers._files"),
    ],
)
def test_the_scanner_sees_every_kind_of_import(
    tmp_path: Path, module: str, source: str, expected: str
) -> None:
    """The rules above can fail: nested, relative and ``from pkg import module`` imports count."""
    path = tmp_path / "m.py"
    path.write_text(source)
    assert expected in {name for _, name in _imports(module, path)}


def test_private_module_detection() -> None:
    assert _private_owner("analyzers.readers._files") == "analyzers.readers"
    assert _private_owner("analyzers.readers._files.sniff") == "analyzers.readers"
    assert _private_owner("analyzers.readers.sniff") is None
    assert _private_owner("analyzers.bundle._safe_member_name") is None  # a name, not a module
