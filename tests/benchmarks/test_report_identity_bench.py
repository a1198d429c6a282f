"""The report-identity script finds every real trace input of a folder the way ``cptrace
analyze`` takes it: a bundle folder whole, the ranks of one run together, every other file
alone. (Its comparison is a sha256 of two processes' stdout; running it is a benchmark.)"""

import shutil
from pathlib import Path
from types import ModuleType

from testkit import DATA_DIR, script_module

ROOT = Path(__file__).resolve().parents[2]


def _identity_module() -> ModuleType:
    return script_module(ROOT / "benchmarks" / "report_identity.py")


def test_inputs_group_ranks_keep_bundles_whole_and_take_every_trace(tmp_path: Path) -> None:
    te = tmp_path / "te"
    te.mkdir()
    for name in (
        "kineto_3arms_rank0.json.gz",
        "kineto_3arms_rank1.json.gz",
        "nsys_3arms.sqlite.gz",
    ):
        shutil.copy(DATA_DIR / "te-2.20.2-h200x2" / name, te / name)
    shutil.copy(DATA_DIR / "openworld/kineto_sdpa_single_gpu.json.gz", tmp_path / "one.json.gz")
    shutil.copy(DATA_DIR / "cpu-gloo/cpu_smoke.tar.gz", tmp_path / "bundle.tar.gz")
    shutil.copytree(DATA_DIR / "te-2.20.2-h200-profile", tmp_path / "profile")
    (tmp_path / "notes.txt").write_text("not a trace")

    found = _identity_module().find_inputs(tmp_path)

    names = [[p.relative_to(tmp_path).as_posix() for p in paths] for paths in found]
    assert names == [
        ["bundle.tar.gz"],
        ["one.json.gz"],
        ["profile"],  # the folder with manifest.json, not the traces inside it
        ["te/kineto_3arms_rank0.json.gz", "te/kineto_3arms_rank1.json.gz"],
        ["te/nsys_3arms.sqlite.gz"],
    ]
