"""One key per kernel, whichever profiler demangled its name.

Nsight Systems and the PyTorch profiler (Kineto, through CUPTI) name the same kernel in two
C++ demangling styles; on the real TE 2.20.2 traces every templated kernel differs::

    nsys (EDG style)                              Kineto (GNU c++filt style)
    void at::native::vectorized_elementwise_      void at::native::vectorized_elementwise_
      kernel<(int)4, ...CUDAFunctor_add<int>,       kernel<4, ...CUDAFunctor_add<int>,
      std::array<char *, (unsigned long)3>>         std::array<char*, 3ul> >(int,
      (int, T2, T3)                                 at::native::CUDAFunctor_add<int>, ...)
    at::native::<unnamed>::...                    at::native::(anonymous namespace)::...
    ...::[lambda() (instance 1)]::operator ()()   ...::{lambda()#1}::operator()() const
    thd_lse_kernel<(bool)1, ...>(float *, ...)    thd_lse_kernel<true, ...>(float*, ...)
    cu_seqlens_to_actual_seqlens(long, long,      cu_seqlens_to_actual_seqlens(long, long,
      const int *, const int *, int *, int *)       int const*, int const*, int*, int*)

:func:`kernel_key` maps both spellings to one string: integer template arguments without
their cast or suffix (``(int)4``, ``4``, ``(unsigned long)4096``, ``4096ul`` -> ``4``,
``4096``; ``(bool)1``, ``true`` -> ``1``), one spelling of anonymous namespaces and lambdas,
no ``const``/``volatile`` (EDG writes ``const int *``, GNU ``int const*``), no whitespace, no
``void`` return types (EDG also writes them for function templates inside template arguments),
no parameter list of a function template specialization (EDG writes the template's parameter
names ``(T1, T2, T3)`` or ``const T1 &`` where GNU substitutes the types, so the lists cannot be
reconciled; the template arguments already tell instances apart) and no trailing parameter list
of the kernel itself.

The key is for matching only (comparisons, ``analyzers.compare.kernel_deltas``); tables show
the name as the trace spells it. Two names that differ only in what the key drops (a ``const``,
an overload's parameter types) share a key: their counts and times are added.
"""

from __future__ import annotations

import re
from functools import lru_cache

_EDG_LAMBDA = re.compile(r"\[lambda\((.*?)\) \(instance (\d+)\)\]")
_ANONYMOUS = re.compile(r"\(anonymous namespace\)|<unnamed>")
_QUALIFIER = re.compile(r"\b(?:const|volatile)\b")
_SPACE = re.compile(r"\s+")
_NESTED_VOID = re.compile(r"([<,] ?)void (?=[A-Za-z_])")
_INT_CAST = re.compile(
    r"\((?:unsigned|signed)?(?:char|short|int|long|longlong|bool|__int128)\)(-?\d+)"
)
_INT_SUFFIX = re.compile(r"(?<=[<,(])(-?\d+)(?:ull|ul|ll|u|l)(?=[,>)])", re.IGNORECASE)
_BOOL = re.compile(r"(?<=[<,(])(true|false)(?=[,>)])")


def _strip_template_parameters(name: str) -> str:
    """``name`` without the parameter list of every function template specialization in it
    (a ``(...)`` right after a ``>``), at any depth."""
    out: list[str] = []
    i, n = 0, len(name)
    while i < n:
        ch = name[i]
        if ch == "(" and out and out[-1] == ">":
            depth = 0
            j = i
            while j < n:
                depth += {"(": 1, ")": -1}.get(name[j], 0)
                if depth == 0:
                    break
                j += 1
            i = j + 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _strip_parameters(name: str) -> str:
    """``name`` without its trailing ``(...)`` (the kernel's own parameter list), if any."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        ch = name[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                return name[:i] if i > 0 else name
    return name  # unbalanced: leave it as it is


@lru_cache(maxsize=65536)
def kernel_key(name: str) -> str:
    """The comparison key of a kernel name (the module docstring lists every rule).

    >>> kernel_key("void k<(int)4, (bool)1>(T1 *, const int *)") == kernel_key(
    ...     "void k<4, true>(float*, int const*)")
    True
    """
    key = _EDG_LAMBDA.sub(r"{lambda(\1)#\2}", name.strip())
    key = _ANONYMOUS.sub("{anon}", key)
    key = _QUALIFIER.sub("", key)
    key = _SPACE.sub(" ", key).strip()
    key = _NESTED_VOID.sub(r"\1", key.removeprefix("void "))
    key = _SPACE.sub("", key)  # also "operator ()" -> "operator()", "> >" -> ">>"
    key = _INT_CAST.sub(r"\1", key)
    key = _INT_SUFFIX.sub(r"\1", key)
    key = _BOOL.sub(lambda m: "1" if m.group(1) == "true" else "0", key)
    return _strip_parameters(_strip_template_parameters(key))


__all__ = ["kernel_key"]
