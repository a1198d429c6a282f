"""The nsys python-functions-trace file is generated from the helper catalog, not hand-written."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from analyzers.catalog import load_catalog
from runners.nsys import (
    catalog_function_patterns,
    export_command,
    profile_command,
    resolve_functions,
    write_python_functions_trace,
)

# A stand-in package laid out like TE 2.20's: the resolver reads sources with ast, so the files
# only need the right names in the right places.
FAKE_FILES = {
    "fakete/__init__.py": "",
    "fakete/pytorch/__init__.py": "",
    "fakete/pytorch/attention/__init__.py": "",
    "fakete/pytorch/attention/context_parallel.py": (
        "def get_cu_seqlens_on_cp_rank(cu, cup, cp, rank, first, second):\n    return cu\n"
        "def _zero_thd_padding(tensors, cu, cup):\n    pass\n"
        "def cp_p2p_fwd_prepare_qkv(*a):\n    pass\n"
        "class AttnFuncWithCPAndKVP2P:\n    def forward(ctx):\n        pass\n"
    ),
    "fakete/pytorch/attention/utils.py": "def get_thd_padding_mask(cu, cup):\n    pass\n",
    "fakete/pytorch/other.py": "def merge(a, b):\n    pass\n",
}


@pytest.fixture()
def fake_te(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for rel, text in FAKE_FILES.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fakete"
    sys.modules.pop("fakete", None)


def test_catalog_yields_te_helper_functions() -> None:
    pairs = catalog_function_patterns(load_catalog(use_env=False).helpers)
    funcs = {func for _, func in pairs}
    assert {"get_cu_seqlens_on_cp_rank", "_zero_thd_padding", "cp_p2p_fwd_prepare_qkv"} <= funcs
    # NVTX ranges the code emits itself, built-ins and generic methods are not traced.
    assert not funcs & {"forward", "backward", "metadata", "thd_read_half_tensor"}


def test_resolves_modules_from_sources(fake_te: str) -> None:
    pairs = catalog_function_patterns(load_catalog(use_env=False).helpers)
    found = resolve_functions(pairs, package=fake_te)
    cp = "fakete.pytorch.attention.context_parallel"
    assert set(found) == {cp, "fakete.pytorch.attention.utils"}
    assert {"get_cu_seqlens_on_cp_rank", "_zero_thd_padding", "cp_p2p_fwd_prepare_qkv"} <= set(
        found[cp]
    )
    assert found["fakete.pytorch.attention.utils"] == ["get_thd_padding_mask"]


def test_missing_package_traces_nothing() -> None:
    assert resolve_functions([(None, "fn")], package="no_such_package_cptrace") == {}


def test_written_file_is_nsys_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     fake_te: str) -> None:
    import runners.nsys as nsys_mod

    original = nsys_mod.resolve_functions
    monkeypatch.setattr(nsys_mod, "resolve_functions",
                        lambda pairs: original(pairs, package=fake_te))
    target = tmp_path / "pft.json"
    write_python_functions_trace(target, load_catalog(use_env=False).helpers)
    doc = json.loads(target.read_text())
    assert all(set(entry) >= {"module", "functions"} for entry in doc)
    modules = {entry["module"] for entry in doc}
    assert "fakete.pytorch.attention.context_parallel" in modules


def test_profile_and_export_commands(tmp_path: Path) -> None:
    nsys = ["sh", "nsys.sh", ".gpu/debs"]
    cmd = profile_command(nsys, output=tmp_path / "r", trace="cuda,nvtx",
                          functions_json=tmp_path / "f.json", extra_args=["--foo"])
    assert cmd[:4] == [*nsys, "profile"]
    assert "--capture-range=cudaProfilerApi" in cmd and "--sample=none" in cmd
    assert f"--python-functions-trace={tmp_path / 'f.json'}" in cmd and cmd[-1] == "--foo"
    export = export_command(nsys, report=tmp_path / "r.nsys-rep", sqlite=tmp_path / "r.sqlite")
    assert export[3:6] == ["export", "--type", "sqlite"] and export[-1].endswith(".nsys-rep")
