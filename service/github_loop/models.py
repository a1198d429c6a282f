"""The loop's contracts: the suite file, the service's per-repository config, job checkouts.

``.cptrace.yml`` (in the target repository, read at the pull request's head SHA)::

    setup: pip install -e .          # run in the checkout before the specs (optional)
    suites:
      h200x2:
        gpus: 2                      # the runner kind: jobs go to runners offering this many
        specs:
          - path: bench/cp_smoke.yaml  # a workload spec file of the repository at that commit
          - {name: inline, ...}        # or a spec inline
          - name: train                # or the repository's own command, under cptrace profile
            command: torchrun --nproc-per-node 2 train.py --steps 20
            profile: {torch: true}
        thresholds: {threshold_pct: 5, alpha: 0.05, max_launch_increase: 0}

Strict models (unknown keys are errors), so a typo in a threshold is reported, not ignored. An
entry with a ``command`` key is a command entry (``contracts.profile_entry.CommandEntry``),
any other mapping a workload spec (inline or by ``path``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from contracts import validation
from contracts.profile_entry import CommandEntry
from pr_bot.policy import Thresholds

SUITE_FILE = ".cptrace.yml"
_SUITE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/+-]{0,99}$"
_SPEC_PATH = re.compile(r"^(?!/)(?!.*(?:^|/)\.\.(?:/|$))[A-Za-z0-9._/+-]{1,300}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SpecRef(_Strict):
    """A workload spec: a file of the repository at the job's commit, or the spec inline."""

    path: str | None = Field(default=None, description="repository-relative path of a spec")
    spec: dict[str, Any] | None = Field(default=None, description="the spec itself")

    @model_validator(mode="before")
    @classmethod
    def _inline(cls, raw: Any) -> Any:
        # A mapping without "path"/"spec" keys is an inline spec (the common short form).
        if isinstance(raw, dict) and not ({"path", "spec"} & raw.keys()):
            return {"spec": raw}
        if isinstance(raw, str):
            return {"path": raw}
        return raw

    @model_validator(mode="after")
    def _one_of(self) -> SpecRef:
        if (self.path is None) == (self.spec is None):
            raise ValueError("give exactly one of 'path' (a file in the repository) or a spec")
        if self.path is not None and not _SPEC_PATH.match(self.path):
            raise ValueError(f"path {self.path!r}: expected a relative path inside the repository")
        return self


def _entry_kind(raw: Any) -> str:
    """``command`` for a mapping with a command key, else ``spec`` (a path or an inline spec)."""
    if isinstance(raw, dict):
        return "command" if "command" in raw else "spec"
    return "command" if isinstance(raw, CommandEntry) else "spec"


SuiteEntry = Annotated[
    Annotated[CommandEntry, Tag("command")] | Annotated[SpecRef, Tag("spec")],
    Discriminator(_entry_kind),
]


class Suite(_Strict):
    """One suite: the specs and commands to run, where, and the policy that judges them."""

    gpus: int = Field(default=1, ge=0, le=1024, description="GPUs a runner must offer")
    specs: list[SuiteEntry] = Field(min_length=1, max_length=20)
    thresholds: Thresholds = Field(default_factory=Thresholds)
    setup: str | None = Field(default=None, max_length=2000, description="overrides the top one")


class SuiteFile(_Strict):
    """``.cptrace.yml``."""

    setup: str | None = Field(default=None, max_length=2000)
    suites: dict[str, Suite] = Field(min_length=1, max_length=20)

    @field_validator("suites")
    @classmethod
    def _names(cls, suites: dict[str, Suite]) -> dict[str, Suite]:
        for name in suites:
            if not re.match(_SUITE_NAME, name):
                raise ValueError(
                    f"suite name {name!r}: expected 1-100 letters, digits or ._:/+- "
                    "starting with a letter or digit"
                )
        return suites


_ENTRY_TAGS = frozenset({"command", "spec"})


def first_error_parts(exc: ValidationError) -> tuple[str, str, str]:
    """``(field path, message, how to fix it)`` of the first validation error."""
    first = validation.first_error(exc, tags=_ENTRY_TAGS)
    return first.where(), first.message, _fix(first.kind, list(first.path), first.message)


def _fix(kind: str, parts: list[str], message: str) -> str:
    """A one-line fix for a pydantic error type (the message says what was wrong)."""
    name = parts[-1] if parts else "the file"
    parent = ".".join(parts[:-1]) or "the top level"
    if kind == "extra_forbidden":
        return (
            f"remove {name!r} from {parent} or correct its spelling "
            "(unknown keys are refused so that a typo is not silently ignored)"
        )
    if kind == "missing":
        return f"add {name!r} to {parent}"
    if kind in ("too_short", "too_long"):
        return f"change the number of entries in {'.'.join(parts)}: {message.lower()}"
    if kind == "model_type" or kind.endswith("_type") or kind.endswith("_parsing"):
        return f"give {'.'.join(parts) or 'the file'} the expected type: {message.lower()}"
    return f"change {'.'.join(parts) or 'the file'}: {message}"


def first_error(exc: ValidationError) -> str:
    """``suites.smoke.specs.1.profile.torch_active: Input should be ...``: the first error's
    field path (the entry kind pydantic adds after a list index left out) and its message."""
    field, message, _ = first_error_parts(exc)
    return f"{field}: {message}"


class RepoConfig(_Strict):
    """The service's own settings for one repository (``CPTRACE_GITHUB_REPOS`` file)."""

    clone_url: str | None = Field(
        default=None, description="where runners fetch from (default: the webhook's clone_url)"
    )
    suites: SuiteFile | None = Field(
        default=None, description="used instead of the repository's .cptrace.yml"
    )
    tracked_branches: list[str] = Field(default_factory=lambda: ["main"])
    fetch_depth: int = Field(default=1, ge=1, le=10000)


class JobCheckout(_Strict):
    """What a runner checks out for a job, and how the run is tagged (sent with the claim)."""

    repo: str
    clone_url: str
    sha: str = Field(pattern=r"^[0-9a-f]{40}$")
    ref: str | None = Field(default=None, description="the branch the run is tagged with")
    pr: int | None = None
    base_sha: str | None = None
    suite: str
    setup: str | None = None
    fetch_depth: int = 1
