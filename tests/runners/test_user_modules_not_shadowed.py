"""Whose modules win in the children: the user's under ``cptrace profile``, cptrace's under
``cptrace run``.

``cptrace profile`` runs the user's own job, so it must never shadow the job's modules with
cptrace's. A user project with its own ``tests`` and ``contracts`` packages next to its script, and
``runners``, ``web`` and a ``sitecustomize`` on its own ``PYTHONPATH`` (all names cptrace's
source tree uses too), is profiled unedited under torchrun (2 gloo ranks): every rank must
import the user's packages, the user's ``sitecustomize`` must still run, cptrace's
``cp_attention`` must still be importable from the source tree (last on the path), and the
probe, the torch profiler and the rank status must still have worked.

``cptrace run`` runs only cptrace's own per-rank module (``-m runners.workload``), so there
cptrace's modules must win, also when it is started inside a user project that has its own
``runners`` and ``contracts`` packages in the working directory.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from analyzers.bundle import read_bundle
from cptrace.cli import app
from runners.profile.run import BOOTSTRAP_DIR, ProfileOptions, child_environment

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]

TRAIN = '''
"""The user's job: imports its own packages, then trains on the bundled cp_attn."""
import itertools, json, os, sys

import torch
import torch.distributed as dist

import tests.helpers  # the user's tests/ (script directory)
from contracts import shapes  # the user's contracts/ (script directory)
from runners import user_runner  # the user's runners/ (the user's PYTHONPATH)
import web  # the user's web/ (the user's PYTHONPATH)
from cp_attention import PackedBatch, cp_attn, partition_for_rank  # cptrace's, from the tree

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
seen = {name: sys.modules[name].__file__ for name in
        ("tests", "tests.helpers", "contracts", "contracts.shapes", "runners", "web",
         "cp_attention")}
seen["marks"] = [tests.helpers.MARK, shapes.MARK, user_runner.MARK, web.MARK]
seen["sitecustomize"] = os.environ.get("USER_SITECUSTOMIZE_RAN")
seen["cptrace_modules"] = sorted(n for n in sys.modules if n.split(".")[0] in ("cptrace",))
with open(os.path.join(os.environ["USER_OUT"], f"seen{rank}.json"), "w") as fh:
    json.dump(seen, fh)

lengths = [16, 8, 8]
cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
meta = PackedBatch.from_cu_seqlens(cu, cu.clone(), cp_size=world)
proj = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(proj.parameters(), lr=0.01)
x = partition_for_rank(torch.randn(meta.total_tokens, 2, 8), meta, rank)
for _ in range(shapes.STEPS):
    h = proj(x.reshape(x.shape[0], -1)).reshape(x.shape)
    cp_attn(h, h, h, meta, comm="p2p").square().mean().backward()
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
'''


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_only_the_bootstrap_goes_before_the_users_pythonpath(tmp_path: Path) -> None:
    env = child_environment(ProfileOptions(torch=True, env={"PYTHONPATH": "/u/a:/u/b"}), tmp_path)
    assert env["PYTHONPATH"].split(":") == [str(BOOTSTRAP_DIR), "/u/a", "/u/b"]


def test_the_jobs_own_packages_win_and_the_probe_still_works(tmp_path: Path) -> None:
    project, lib, seen_dir = tmp_path / "project", tmp_path / "lib", tmp_path / "seen"
    _write(project / "train.py", TRAIN)
    _write(project / "tests" / "__init__.py", "")
    _write(project / "tests" / "helpers.py", 'MARK = "user tests"\n')
    _write(project / "contracts" / "__init__.py", "")
    _write(project / "contracts" / "shapes.py", 'MARK = "user contracts"\nSTEPS = 4\n')
    _write(lib / "runners" / "__init__.py", "")
    _write(lib / "runners" / "user_runner.py", 'MARK = "user runners"\n')
    _write(lib / "web" / "__init__.py", 'MARK = "user web"\n')
    _write(lib / "sitecustomize.py", 'import os\nos.environ["USER_SITECUSTOMIZE_RAN"] = "yes"\n')
    seen_dir.mkdir()
    out = tmp_path / "bundle"
    result = CliRunner().invoke(
        app,
        ["profile", "--no-nsys", "--torch", "--probe", "--out", str(out), "--timeout", "240",
         "--", *TORCHRUN, "--nproc-per-node", "2", str(project / "train.py")],
        env={"PYTHONPATH": str(lib), "USER_OUT": str(seen_dir)},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for rank in (0, 1):
        seen = json.loads((seen_dir / f"seen{rank}.json").read_text())
        assert seen["marks"] == ["user tests", "user contracts", "user runners", "user web"]
        for name, where in (("tests.helpers", project), ("contracts.shapes", project),
                            ("runners", lib), ("web", lib)):  # fmt: skip
            assert Path(seen[name]).is_relative_to(where), (name, seen[name])
        assert Path(seen["cp_attention"]).is_relative_to(ROOT)  # ours, found last on the path
        assert seen["sitecustomize"] == "yes"  # the user's own sitecustomize still chained
        assert seen["cptrace_modules"] == []  # the hooks' modules left sys.modules
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["run"]["exit_status"] == 0
    observed = manifest["variants"][0]["facts"]["observed"]
    assert observed["function"] == "cp_attention.cp_attn" and observed["ranks"] == [0, 1]
    assert observed["calls"] == 4 and observed["value_equal_calls"] == 4  # one per step
    with read_bundle(out) as bundle:  # the torch profiler's hooks stepped on each rank
        assert [(t.format, t.rank) for t in bundle.traces] == [("kineto", 0), ("kineto", 1)]


def test_cptrace_run_inside_a_user_project_runs_its_own_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    for package in ("runners", "contracts"):  # would break the ranks if imported there
        _write(project / package / "__init__.py",
               f'raise ImportError("the user\'s {package} package was imported")\n')  # fmt: skip
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "cwd-test", "implementation": "bundled", "device": "cpu", "ranks": 2,
        "seqlens": [16, 8, 4, 4], "heads": 2, "head_dim": 8, "dtype": "fp32", "layers": 1,
        "warmup": 1, "iterations": 2, "profilers": {"mode": "torch", "profiled_steps": 1},
        "variants": {"fixed": {}},
    }))  # fmt: skip
    monkeypatch.chdir(project)  # the ranks inherit it: `-m` would put it first on sys.path
    out = tmp_path / "bundle"
    result = CliRunner().invoke(
        app, ["run", str(spec), "--nproc", "2", "--out", str(out), "--timeout", "240"]
    )
    log = "\n".join(p.read_text() for p in (out / "logs").glob("*.log"))
    assert result.exit_code == 0, result.output + log
    assert "the user's" not in log
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["variants"][0]["iteration_ms"]) == ["0", "1"]  # both ranks timed
