"""The suite's order under xdist: files holding a slow test are collected first, and every
file's tests stay together and in their order (module fixtures are built once per file)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_slow_files_come_first_and_files_stay_whole(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "from testkit import slow_files_first\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    slow_files_first(items)\n"
    )
    pytester.makepyfile(
        test_a_quick="def test_one(): pass\ndef test_two(): pass\n",
        test_b_slow=(
            "import pytest\n"
            "def test_first(): pass\n"
            "@pytest.mark.slow\n"
            "def test_second(): pass\n"
            "def test_third(): pass\n"
        ),
        test_c_quick="def test_only(): pass\n",
    )
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    result = pytester.runpytest("--collect-only", "-q")
    ids = [line for line in result.outlines if "::" in line]
    assert ids == [
        "test_b_slow.py::test_first",
        "test_b_slow.py::test_second",
        "test_b_slow.py::test_third",
        "test_a_quick.py::test_one",
        "test_a_quick.py::test_two",
        "test_c_quick.py::test_only",
    ]
