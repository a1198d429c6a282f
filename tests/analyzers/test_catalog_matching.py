"""The catalog's matchers answer exactly as the plain regexes they replace.

``re:`` patterns used to be matched as ``.*?(?:pattern)`` and globs as ``fnmatch.translate``
regexes, attempted on every name; now a regex runs only on names holding a literal every match
needs, and kernel families test words with substring searches. These tests compare both ways on
every name in the ``tests/data`` traces, on long hostile names, and on random small regexes.
"""

from __future__ import annotations

import fnmatch
import random
import re
from collections.abc import Callable
from functools import cache

import pytest
from testkit import DATA_DIR

from analyzers.catalog import Catalog, _compile, builtin_catalog
from analyzers.findings.summary import _ELEMENTWISE, _OPTIMIZER, _name_family
from analyzers.readers import read_trace
from analyzers.report import KernelFamily

DATA = DATA_DIR
TRACES = sorted([*DATA.glob("*/*.json.gz"), *DATA.glob("*/*.sqlite.gz")])
CATALOG = builtin_catalog()


@cache
def _old(pattern: str) -> Callable[[str], object]:
    """The matcher as it was: ``re:`` behind a lazy prefix, every glob as fnmatch's regex."""
    if pattern.startswith("re:"):
        return re.compile(f".*?(?:{pattern[3:]})", re.DOTALL).match
    return re.compile(fnmatch.translate(pattern)).match


def _old_first(catalog: Catalog, kind: str, name: str, *, unrestricted: bool = False) -> int:
    for index, helper in enumerate(catalog.helpers):
        if unrestricted and helper.within:
            continue
        if any(_old(p)(name) for p in getattr(helper, kind)):
            return index
    return -1


def _hostile() -> list[str]:
    """Long names: none matching, each pattern's literal text buried in them, non-ASCII look-alikes
    (case folding differs from ``str.lower``), the look-behind cases of ``gemm``."""
    patterns = [p for h in CATALOG.helpers for p in (*h.kernels, *h.ranges, *h.python)]
    texts = [re.sub(r"\\[wdb]|[\\()?*+|^$\[\]{}<!:=]", "", p.removeprefix("re:")) for p in patterns]
    long = "k" * 1024
    names = [long, "00001" + long, long + "\n" + long]
    for text in texts:
        names += [long + text, text + long, long[:500] + text + long[:500], text.upper() + long]
    names += [
        "fbgemm" + long,
        long + "implicit_gemm",
        long + "implicitgemm",
        long + "xgemm",
        long + "ﬁ_GEMM",
        long + "İmplicit_gemm",
        long + "ſgd",
        long + "multi_tenſor_apply",
        "void at::native::" + long,
        long + "ncclDevKernel_AllReduce",
        "ADAM" + long,
        long + "K_sgd",
    ]
    return names


@pytest.fixture(scope="module")
def names() -> list[str]:
    assert TRACES, DATA
    found: set[str] = set()
    for path in TRACES:
        found.update(read_trace(path).strings)
    return sorted(found) + _hostile()


def test_the_traces_hold_real_kernel_names(names: list[str]) -> None:
    assert sum(1 for n in names if CATALOG.match_kernel(n) >= 0) > 20


def test_kernel_range_and_sync_matches_are_unchanged(names: list[str]) -> None:
    for name in names:
        assert CATALOG.match_kernel(name) == _old_first(CATALOG, "kernels", name), name[:80]
        assert CATALOG.match_kernel_anywhere(name) == _old_first(
            CATALOG, "kernels", name, unrestricted=True
        ), name[:80]
        ranges = _old_first(CATALOG, "ranges", name)
        python = _old_first(CATALOG, "python", name)
        expected = (ranges, False) if ranges >= 0 else (python, python >= 0)
        assert CATALOG.match_range(name) == expected, name[:80]
        for kind, patterns in (
            ("apis", CATALOG.host_sync_apis),
            ("ops", CATALOG.host_sync_ops),
            ("memcpy", CATALOG.host_sync_memcpy),
        ):
            assert CATALOG.is_sync(kind, name) == any(_old(p)(name) for p in patterns), name[:80]
        for block in CATALOG.block_helpers():
            helper = CATALOG.helpers[block]
            assert CATALOG.block_edge(block, name) == (
                any(_old(p)(name) for p in helper.block_from),
                any(_old(p)(name) for p in helper.block_to),
            ), name[:80]


def test_kernel_family_words_are_unchanged(names: list[str]) -> None:
    for name in names:
        if "nccl" in name.lower():
            expected = KernelFamily.COMMUNICATION
        elif _OPTIMIZER.search(name):
            expected = KernelFamily.OPTIMIZER
        elif _ELEMENTWISE.search(name):
            expected = KernelFamily.ELEMENTWISE
        else:
            expected = KernelFamily.OTHER
        assert _name_family(name) == expected, name[:80]
    assert _name_family("x" * 4096 + "_ForEach_") is KernelFamily.OPTIMIZER


def test_random_regexes_and_globs_answer_as_before() -> None:
    """Small random regexes (groups, alternations, repeats, case-insensitive parts, classes,
    look-arounds) and globs over a tiny alphabet, each against random names: the literal
    prefilter may only skip names the regex cannot match."""
    rng = random.Random(24)
    atoms = ["a", "b", "A", "ab", "ba", ".", "[ab]", "\\w", "\\b", "(?<!a)", "(?=b)", "İ", "ſ"]

    def regex(depth: int) -> str:
        parts = []
        for _ in range(rng.randint(1, 3)):
            roll = rng.random()
            if depth < 2 and roll < 0.2:
                parts.append(f"(?:{regex(depth + 1)}|{regex(depth + 1)})")
            elif depth < 2 and roll < 0.3:
                parts.append(f"(?i:{regex(depth + 1)})")
            elif depth < 2 and roll < 0.4:
                parts.append(f"({regex(depth + 1)}){rng.choice(['*', '+', '?', '{2}', '{0,2}'])}")
            else:
                parts.append(rng.choice(atoms) + rng.choice(["", "", "*", "+", "?"]))
        return "".join(parts)

    alphabet = "abAB İiſsK"
    names = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9))) for _ in range(300)]
    patterns = ["re:" + regex(0) for _ in range(300)] + ["re:(?i)ab|b", "re:(?i:a)b"]
    patterns += [
        "".join(rng.choice("ab*?[]") for _ in range(rng.randint(1, 6))) for _ in range(200)
    ]
    checked = 0
    for pattern in patterns:
        try:
            old = _old(pattern)
        except re.error:
            continue
        new = _compile(pattern)
        for name in names:
            assert bool(new.match(name)) == bool(old(name)), (pattern, name)
        checked += 1
    assert checked > 300
