"""One formatter of pydantic validation errors (``contracts.validation``), for every room."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from contracts.spec import SpecError, parse_spec
from contracts.validation import field_errors, first_error

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("analyzers", "contracts", "service", "web", "cptrace", "runners", "pr_bot")


class _Command(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["command"] = "command"
    argv: list[str]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["spec"] = "spec"
    path: str


class _Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    entries: list[Annotated[_Command | _Spec, Field(discriminator="kind")]]
    sizes: list[int] | int = 1
    name: str = "x"

    @field_validator("name")
    @classmethod
    def _no_spaces(cls, value: str) -> str:
        if " " in value:
            raise ValueError("no spaces in a name")
        return value


def _error(raw: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        _Suite.model_validate(raw)
    return caught.value


def test_the_path_leaves_out_union_labels_and_member_tags() -> None:
    exc = _error({"entries": [{"kind": "command", "argv": "ls"}]})
    assert str(first_error(exc)) == "entries.0.command.argv: Input should be a valid list"
    tagged = first_error(exc, tags=frozenset({"command", "spec"}))
    assert tagged.where() == "entries.0.argv" and tagged.kind == "list_type"
    sizes = {str(e) for e in field_errors(_error({"entries": [], "sizes": ["a"]}))}
    assert "sizes.0: Input should be a valid integer, unable to parse string as an integer" in sizes


def test_our_validators_speak_without_pydantics_prefix() -> None:
    first = first_error(_error({"entries": [], "name": "a b"}))
    assert (first.where(), first.message, first.given) == ("name", "no spaces in a name", "a b")
    whole = first_error(_error([]))
    assert whole.path == () and whole.where() == "(top level)" and whole.where("run") == "run"


def test_the_spec_error_names_the_field() -> None:
    with pytest.raises(SpecError, match=r"^spec.yaml: field ranks: "):
        parse_spec({"name": "x", "ranks": "many"}, source="spec.yaml")


def _formats_locations(path: Path) -> list[int]:
    """Lines that read an error's ``loc`` themselves (``e["loc"]``, ``e.get("loc")``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            if node.slice.value == "loc":
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if node.func.attr == "get" and args[:1] == ["loc"]:
                lines.append(node.lineno)
    return lines


def test_no_other_module_formats_validation_errors() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path == REPO / "contracts" / "validation.py":
                continue
            found += [f"{path.relative_to(REPO)}:{line}" for line in _formats_locations(path)]
    assert not found, "validation errors formatted outside contracts.validation:\n" + "\n".join(
        found
    )
