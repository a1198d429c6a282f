"""TE 2.20's gradient zero-fill is one block of kernels: all of it is the zero-fill helper.

Issue 25, defect 3: the real TE 2.20.2 nsys export (``tests/data/te-2.20.2-h200x2``) traces no
Python frame of ``_zero_thd_padding``, so the zero-fill is matched by kernel name inside TE's CP
backward. Only the arange / compare / masked-fill kernels matched; the copy, searchsorted,
index and add kernels of ``get_thd_padding_mask`` between them went to the container.
"""

from __future__ import annotations

import numpy as np

from analyzers.pipeline import Analysis

ZERO_FILL = "te_thd_grad_zero_fill_inline"
BLOCK_OPEN, BLOCK_CLOSE = "arange_cuda_out", "CompareFunctor"


def _launch_sequences(analysis: Analysis) -> list[list[tuple[str, str]]]:
    """(kernel, helper) of the CP backward's launches, per launching thread in launch order."""
    trace, att = analysis.trace, analysis.attribution
    keep = np.flatnonzero(att.launch >= 0)
    launch = att.launch[keep]
    threads = trace.launches["thread"][launch]
    order = np.lexsort((trace.launches["start"][launch], threads))
    out: dict[int, list[tuple[str, str]]] = {}
    for row, thread in zip(keep[order].tolist(), threads[order].tolist(), strict=True):
        helper = att.name_of(int(att.helper[row]))
        if helper in (ZERO_FILL, "te_cp_backward"):
            name = trace.strings[int(trace.activities["name"][row])]
            out.setdefault(thread, []).append((name, helper))
    return list(out.values())


def test_every_launch_of_the_zero_fill_block_is_the_zero_fill_helper(
    nsys_3arms: Analysis,
) -> None:
    blocks = inside = 0
    for sequence in _launch_sequences(nsys_3arms):
        opened = False
        for name, helper in sequence:
            opened = opened or BLOCK_OPEN in name
            if opened:
                inside += 1
                assert helper == ZERO_FILL, name
            if BLOCK_CLOSE in name:
                blocks += opened
                opened = False
    assert blocks == 384  # every gradient mask of the run, both ranks
    assert inside == 384 * 10  # arange, copy, searchsorted, 3 x (index, add), compare
    searchsorted = [n for s in _launch_sequences(nsys_3arms) for n, h in s if "searchsorted" in n]
    assert len(searchsorted) == 384


def test_kernels_outside_the_blocks_stay_with_the_container(nsys_3arms: Analysis) -> None:
    """The block is bounded: the fills and adds of the gradients around it are not zero-fill."""
    names = {n for s in _launch_sequences(nsys_3arms) for n, h in s if h == "te_cp_backward"}
    assert any("FillFunctor" in n for n in names)
    assert not any("searchsorted" in n or BLOCK_OPEN in n for n in names)
