"""Python-frame labels line up across runs (issue 25): no object address in any label.

The real open-world Kineto trace (``with_stack``: C functions are named ``<built-in method
item of Tensor object at 0x7f6a...>``) and the same trace with every address moved, as a second
process of the same code would name them: both analyses must give the same labels, and their
comparison no line that appears on one side only.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from analyzers.compare import compare_reports
from analyzers.pipeline import analyze
from analyzers.readers._labels import python_frame_label
from analyzers.report import AnalysisReport

DATA = Path(__file__).resolve().parents[1] / "data"
SDPA = DATA / "openworld" / "kineto_sdpa_single_gpu.json.gz"
_ADDRESS = re.compile(rb"at 0x([0-9a-f]+)>")


def _moved(match: re.Match[bytes]) -> bytes:
    return b"at 0x%x>" % (int(match.group(1), 16) + 0x10_0000)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[AnalysisReport, AnalysisReport]:
    text = gzip.decompress(SDPA.read_bytes())
    moved, n = _ADDRESS.subn(_moved, text)
    assert n > 1000  # the trace really names its C functions by address
    other = tmp_path_factory.mktemp("frames") / "kineto_sdpa_moved.json.gz"
    other.write_bytes(gzip.compress(moved, compresslevel=1))
    return analyze(SDPA), analyze(other)


def _labels(report: AnalysisReport) -> set[str]:
    parts = [p for a in [*report.step_accounts, *report.accounts] for p in a.parts]
    return {p.label for p in parts} | {p.detail for p in parts if p.detail}


def test_no_label_keeps_an_address(pair: tuple[AnalysisReport, AnalysisReport]) -> None:
    base, _ = pair
    labels = _labels(base)
    assert "<built-in method _record_function_enter_new of pybind11 object>" in labels
    assert not [label for label in labels if "0x" in label]
    gaps = [g.label for t in [base.timeline, *base.other_timelines] if t for g in t.gaps]
    assert gaps and not [label for label in gaps if "0x" in label]


def test_moved_addresses_give_the_same_account(
    pair: tuple[AnalysisReport, AnalysisReport],
) -> None:
    base, head = pair
    assert _labels(base) == _labels(head)
    diff = compare_reports(base, head)
    assert diff.account and all(d.delta_ns == 0 for d in diff.account)
    assert all(d.base_ns == d.head_ns for d in diff.account)


@pytest.mark.parametrize(
    ("raw", "label"),
    [
        ("<built-in method item of Tensor object at 0x7f6a6e964fa0>",
         "<built-in method item of Tensor object>"),
        ("<built-in method thd_read_half_tensor of pybind11_builtins.pybind11_detail_function_"
         "record_v1_system_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1 object at 0x7efb08a0>",
         "<built-in method thd_read_half_tensor of pybind11 object>"),
        ("<built-in function _cuda_synchronize>", "<built-in function _cuda_synchronize>"),
        ("train.py(6): check_finite", "train.py(6): check_finite"),
    ],
)  # fmt: skip
def test_one_label_per_frame_kind(raw: str, label: str) -> None:
    assert python_frame_label(raw) == label
