"""Test helpers have one home, ``tests/testkit``: the data path, ``free_port``, the reference
workload. A second copy in a test room is how they drifted apart before."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
TESTKIT = TESTS / "testkit"
_DATA_PATH = re.compile(r'__file__.*/ "data"|/ "tests" / "data"')
_WORKLOAD_KEYS = {"implementation", "cp_size", "heads", "head_dim", "layers", "seqlens"}


def _test_sources() -> list[Path]:
    return [p for p in sorted(TESTS.rglob("*.py")) if TESTKIT not in p.parents]


def test_the_data_path_is_built_only_in_testkit() -> None:
    found = [
        f"{p.relative_to(TESTS)}:{n}"
        for p in _test_sources()
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if _DATA_PATH.search(line) and p != Path(__file__)
    ]
    assert not found, "use testkit.DATA_DIR:\n" + "\n".join(found)


def test_free_port_and_the_reference_workload_are_defined_only_in_testkit() -> None:
    found = []
    for path in _test_sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name == "free_port":
                found.append(f"{path.relative_to(TESTS)}:{node.lineno}: def free_port")
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if keys >= _WORKLOAD_KEYS:
                    found.append(f"{path.relative_to(TESTS)}:{node.lineno}: a reference workload")
    assert not found, "use testkit.free_port / testkit.REFERENCE_WORKLOAD:\n" + "\n".join(found)
