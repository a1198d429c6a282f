"""The Docker images' tree holds the product, and it imports.

Docker is not available to the tests, so the build context is rebuilt here the way Docker
builds it: each stage's ``COPY`` sources from the repository, less what ``.dockerignore``
excludes (last matching rule wins, ``!`` re-includes, a rule on a folder covers its contents).
Every package ``pyproject.toml`` lists must be in that tree with all its files, and the tree,
copied to a folder of its own, must import the service, the web pages, the CLI and the runners.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
#: Paths outside the packages the service image needs (install metadata, --seed-demo).
SERVICE_NEEDS = ("pyproject.toml", "README.md", "demo/bundles", "demo/traces")
#: Never in an image: development-only folders.
NEVER = ("tests", "docs", "benchmarks", ".git", ".venv")

Rule = tuple[bool, re.Pattern[str]]


def _glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Docker's .dockerignore pattern (Go filepath.Match plus ``**``) as an anchored regex."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def parse_dockerignore(text: str) -> list[Rule]:
    rules: list[Rule] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip().lstrip("/"))
        rules.append((keep, _glob_to_regex(pattern)))
    return rules


def excluded(path: str, rules: list[Rule]) -> bool:
    """True when the rules leave ``path`` (relative, ``/``-separated) out of the context."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict = False
    for keep, regex in rules:
        if any(regex.match(prefix) for prefix in prefixes):
            verdict = not keep
    return verdict


def stage_sources(dockerfile: str) -> dict[str, list[str]]:
    """Stage name -> the context paths its ``COPY`` lines take (``--from`` copies excluded)."""
    stages: dict[str, list[str]] = {}
    current = ""
    for line in dockerfile.splitlines():
        if match := re.match(r"^FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.IGNORECASE):
            current = match.group(1) or f"stage{len(stages)}"
            stages[current] = []
        elif match := re.match(r"^COPY\s+(.+)$", line, re.IGNORECASE):
            words = [w for w in match.group(1).split() if not w.startswith("--chown")]
            if any(w.startswith("--from") for w in words):
                continue
            stages[current].extend(w.rstrip("/") for w in words[:-1])
    return stages


def image_tree(root: Path, sources: list[str], rules: list[Rule]) -> set[str]:
    """Relative paths of the files the stage's ``COPY`` lines put in the image."""
    files: set[str] = set()
    for source in sources:
        start = (root / source).resolve()
        if start.is_file():
            rel = start.relative_to(root).as_posix()
            if not excluded(rel, rules):
                files.add(rel)
            continue
        for folder, dirs, names in os.walk(start):
            rel_dir = Path(folder).relative_to(root).as_posix()
            rel_dir = "" if rel_dir == "." else rel_dir + "/"
            dirs[:] = [d for d in dirs if not excluded(rel_dir + d, rules)]
            files.update(rel_dir + n for n in names if not excluded(rel_dir + n, rules))
    return files


def package_files(root: Path) -> dict[str, list[str]]:
    """Each top-level package pyproject lists -> its tracked-looking files (no caches)."""
    include = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    out: dict[str, list[str]] = {}
    for top in sorted({p.rstrip("*").rstrip(".") for p in include}):
        assert (root / top / "__init__.py").is_file(), f"pyproject lists {top!r}: no package"
        out[top] = sorted(
            p.relative_to(root).as_posix()
            for p in (root / top).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        )
    return out


def missing_from_image(root: Path, dockerfile: str, dockerignore: str) -> dict[str, list[str]]:
    """Stage -> the package files and service needs that its tree lacks."""
    rules = parse_dockerignore(dockerignore)
    packages = package_files(root)
    missing: dict[str, list[str]] = {}
    for stage, sources in stage_sources(dockerfile).items():
        tree = image_tree(root, sources, rules)
        wanted = [f for files in packages.values() for f in files]
        if stage == "service":
            wanted += [n for n in SERVICE_NEEDS if (root / n).is_file()]
            wanted += [
                p.relative_to(root).as_posix()
                for n in SERVICE_NEEDS
                if (root / n).is_dir()
                for p in (root / n).rglob("*")
                if p.is_file()
            ]
        missing[stage] = sorted(set(wanted) - tree)
    return missing


def _dockerignore() -> str:
    return (ROOT / ".dockerignore").read_text()


def test_both_stages_hold_every_package_of_pyproject() -> None:
    stages = stage_sources(DOCKERFILE)
    assert set(stages) == {"service", "runner"}
    assert {stage: files for stage, files in missing_from_image(
        ROOT, DOCKERFILE, _dockerignore()
    ).items() if files} == {}


def test_images_leave_development_folders_out() -> None:
    rules = parse_dockerignore(_dockerignore())
    for stage, sources in stage_sources(DOCKERFILE).items():
        tree = image_tree(ROOT, sources, rules)
        leaked = sorted(f for f in tree if f.split("/")[0] in NEVER or "__pycache__" in f)
        assert leaked == [], f"{stage}: {leaked[:5]}"


def test_the_check_sees_a_package_left_out(tmp_path: Path) -> None:
    """The Dockerfile that copied neither contracts/ nor pr_bot/ fails the check, as would an
    ignore rule that drops one package; a re-include rule brings a file back."""
    old = DOCKERFILE.replace("COPY . .", "COPY analyzers ./analyzers\nCOPY service ./service")
    missing = missing_from_image(ROOT, old, _dockerignore())
    assert any(f.startswith("contracts/") for f in missing["service"])
    assert any(f.startswith("pr_bot/") for f in missing["runner"])
    dropped = missing_from_image(ROOT, DOCKERFILE, _dockerignore() + "\ncontracts\n")
    assert "contracts/__init__.py" in dropped["service"]
    rules = parse_dockerignore("docs\n!docs/keep.md\n**/*.pyc\n")
    assert excluded("docs/web.md", rules) and not excluded("docs/keep.md", rules)
    assert excluded("web/static/x.pyc", rules) and not excluded("web/static/x.py", rules)


def test_the_service_tree_imports(tmp_path: Path) -> None:
    """The service stage's tree, alone in a folder, imports the app, the pages and the CLI."""
    rules = parse_dockerignore(_dockerignore())
    tree = image_tree(ROOT, stage_sources(DOCKERFILE)["service"], rules)
    image = tmp_path / "app"
    for rel in tree:
        target = image / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, target)
    code = (
        "import sys, service.main, cptrace.app, web.routes, pr_bot, contracts, analyzers\n"
        "import runners.spec\n"
        "mods = [service.main, cptrace.app, web.routes, pr_bot, contracts, analyzers,\n"
        "        runners.spec]\n"
        "bad = [m.__name__ for m in mods if not m.__file__.startswith(sys.argv[1])]\n"
        "assert not bad, bad\n"
        "cptrace.app.create_app\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(image)],
        cwd=image,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        pytest.fail(f"the image tree does not import:\n{done.stderr[-2000:]}")
