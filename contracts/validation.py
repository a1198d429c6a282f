"""The one formatter of pydantic validation errors: which field, what is wrong, in words.

Every room that validates input with pydantic (the manifest, the bundle's run record, a saved
report, the workload spec, a command entry, the loop's ``.cptrace.yml``, the settings, the API's
request bodies) names the bad field the same way: its path joined with dots, pydantic's union
labels (``list[int]``, ``function-after[...]``) left out, and the message without pydantic's
``Value error, `` prefix (the message of our own validators).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

_UNION_LABELS = ("list[", "dict[", "tuple[", "set[", "function-")
_PREFIXES = ("Value error, ", "Assertion failed, ")


class HasErrors(Protocol):
    """``pydantic.ValidationError`` and FastAPI's ``RequestValidationError`` alike."""

    def errors(self) -> Sequence[Any]: ...


@dataclass(frozen=True, slots=True)
class FieldError:
    """One validation error: the field's path, the message, pydantic's error type, the input."""

    path: tuple[str, ...]
    message: str
    kind: str = ""
    given: Any = None

    def where(self, top: str = "(top level)") -> str:
        """``variants.fast.seqlens.2``, or ``top`` for an error of the whole object."""
        return ".".join(self.path) or top

    def __str__(self) -> str:
        return f"{self.where()}: {self.message}"


def _path(loc: Sequence[Any], tags: frozenset[str]) -> tuple[str, ...]:
    parts: list[str] = []
    for i, part in enumerate(loc):
        text = str(part)
        if text.startswith(_UNION_LABELS):
            continue
        if text in tags and i and isinstance(loc[i - 1], int):  # a tagged union's member
            continue
        parts.append(text)
    return tuple(parts)


def _message(msg: object) -> str:
    text = str(msg)
    for prefix in _PREFIXES:
        text = text.removeprefix(prefix)
    return text


def field_errors(exc: HasErrors, *, tags: frozenset[str] = frozenset()) -> list[FieldError]:
    """Every error of ``exc`` in words; ``tags``: member names of tagged unions in the paths."""
    out = []
    for error in exc.errors():
        detail: Mapping[str, Any] = error if isinstance(error, Mapping) else {}
        out.append(
            FieldError(
                path=_path(tuple(detail.get("loc", ())), tags),
                message=_message(detail.get("msg", "invalid")),
                kind=str(detail.get("type", "")),
                given=detail.get("input"),
            )
        )
    return out


def first_error(exc: HasErrors, *, tags: frozenset[str] = frozenset()) -> FieldError:
    """The first error of ``exc`` (pydantic orders them by field)."""
    found = field_errors(exc, tags=tags)
    return found[0] if found else FieldError(path=(), message="invalid")


__all__ = ["FieldError", "HasErrors", "field_errors", "first_error"]
