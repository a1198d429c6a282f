"""Range names made comparable across calls and runs: one normalised label per kind of name.

A name that carries a per-call counter or a per-process address lines up with nothing: two
runs of the same code name the same frame differently, so comparisons see one label appear and
another disappear. Readers replace such names by their label at read time (``relabel``), once
per distinct symbol, so every later stage (attribution, the account, the summary, comparisons)
sees only the label.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from analyzers.model import SymbolTable

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+(?=>)")
_PYBIND_RECORD = re.compile(r" of pybind11_builtins\.\S+ object>")


def python_frame_label(text: str) -> str:
    """A Kineto ``python_function`` name without the object address Python's ``repr`` puts in
    a C function's name.

    A built-in method is named after the object it is bound to, address included: ``<built-in
    method item of Tensor object at 0x7f6a6e964fa0>``; a pybind11 function (TE's
    ``thd_read_half_tensor``) after its function record, whose type name spells the compiler
    ABI (``pybind11_builtins.pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx_use
    _cxx11_abi_1``). Labels: one per kind of frame, ``<built-in method item of Tensor object>``
    and ``<built-in method thd_read_half_tensor of pybind11 object>``. Python functions
    (``train.py(6): check_finite``) and names without an address stay as they are.

    >>> python_frame_label("<built-in method item of Tensor object at 0x7f6a6e964fa0>")
    '<built-in method item of Tensor object>'
    >>> python_frame_label("<built-in method f of pybind11_builtins.x_abi_1 object at 0x1>")
    '<built-in method f of pybind11 object>'
    """
    if " at 0x" not in text:
        return text
    return _PYBIND_RECORD.sub(" of pybind11 object>", _ADDRESS.sub("", text))


def relabel(
    names: npt.NDArray[np.int32], strings: SymbolTable, label: Callable[[str], str]
) -> npt.NDArray[np.int32]:
    """``names`` (symbol ids) with every symbol replaced by the symbol of its ``label`` (asked
    once per distinct symbol, not per row); ``names`` itself when no label differs."""
    if len(names) == 0:
        return names
    present = np.unique(names).tolist()
    remap = {s: strings.intern(label(strings[s])) for s in present}
    changed = {s: t for s, t in remap.items() if s != t}
    if not changed:
        return names
    table = np.arange(max(max(remap.values()), max(present)) + 1, dtype=np.int32)
    for s, t in changed.items():
        table[s] = t
    out: npt.NDArray[np.int32] = table[names]
    return out


__all__ = ["python_frame_label", "relabel"]
