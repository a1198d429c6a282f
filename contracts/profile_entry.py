"""A suite entry that runs the user's own command under ``cptrace profile`` (the PR loop).

``.cptrace.yml`` lists workload specs or commands; a command entry is::

    - name: train
      command: torchrun --nproc-per-node 2 train.py --steps 30
      profile: {torch: true, torch_active: 5}

Every step of the job is timed (``cptrace profile``): the run's iteration times are the steps
after the first ``time_warmup`` ones, less the steps the PyTorch profiler recorded (its
``torch_warmup`` + ``torch_active`` steps run with tracing on). With the defaults a job of S
optimizer steps (S - 1 step intervals) gives n = S - 1 - 1 - (1 + torch_active): the 30 steps
above give n = 22, enough for the gate's 5% threshold to decide (n >= 20).

The command runs in the checked-out workspace of the job's commit, so it is the repository's
own training script at that commit. The model lives here, below the service (which validates
the suite file) and the runners (``cptrace agent`` runs it), so both read one schema.

Its :meth:`CommandEntry.config_key` is what makes two runs of it comparable besides the GPU
and the software stack: the same command line and the same profiler settings.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ENTRY_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
MAX_COMMAND_CHARS = 2000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProfileSettings(_Strict):
    """``profile:`` of a command entry: the ``cptrace profile`` options the loop exposes."""

    torch: bool = Field(default=False, description="PyTorch profiler, stepped by the job")
    nsys: bool = Field(default=False, description="Nsight Systems per rank (needs nsys)")
    probe: bool = Field(default=False, description="record TE/cp_attn metadata facts")
    torch_wait: int = Field(default=1, ge=0, le=10_000, description="steps before warm-up")
    torch_warmup: int = Field(default=1, ge=0, le=10_000, description="warm-up steps")
    torch_active: int = Field(default=3, ge=1, le=10_000, description="recorded steps")
    step_function: str = Field(
        default="optimizer",
        max_length=300,
        pattern=r"^(optimizer|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$",
        description="what a step is: optimizer (optimizer.step calls) or MODULE:FUNC",
    )
    with_stack: bool = Field(default=True, description="torch: Python stacks")
    record_shapes: bool = Field(default=False, description="torch: input shapes")
    nsys_trace: str = Field(
        default="cuda,nvtx", pattern=r"^[a-z0-9_,-]{1,200}$", description="nsys profile -t"
    )
    watchdog_s: float = Field(
        default=60.0, gt=0, le=3600, description="stop the job this long after a rank fails"
    )
    hang_timeout_s: float = Field(
        default=300.0, gt=0, le=86_400,
        description="a rank waiting this long in one collective: hung (stacks dumped, stopped)",
    )
    time_warmup: int = Field(
        default=1, ge=0, le=10_000, description="steps left out of the iteration times first"
    )
    timeout_s: float | None = Field(
        default=None, gt=0, le=7 * 86_400, description="stop the job after this long"
    )

    @model_validator(mode="after")
    def _something(self) -> ProfileSettings:
        if not (self.torch or self.nsys or self.probe):
            raise ValueError("nothing to record: set at least one of torch, nsys or probe to true")
        return self


class CommandEntry(_Strict):
    """One command of a suite, run under ``cptrace profile`` in the job's checkout."""

    kind: Literal["command"] = "command"
    name: str = Field(pattern=ENTRY_NAME, description="the entry's name in the comment")
    command: str = Field(
        min_length=1,
        max_length=MAX_COMMAND_CHARS,
        description="the job's command line (python, torchrun or srun), shell-quoted",
    )
    profile: ProfileSettings

    @field_validator("command")
    @classmethod
    def _splits(cls, command: str) -> str:
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ValueError(f"cannot split the command line: {exc}") from exc
        if not argv:
            raise ValueError("the command line is empty")
        return command

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.command)

    def config_key(self) -> str:
        """Same command line (token by token) and same profiler settings -> same key.

        Settings added later count only when they differ from their default, so existing
        entries keep their key (and their baselines); the hang timeout never changes what is
        measured and never counts.
        """
        profile = self.profile.model_dump(mode="json", exclude={"hang_timeout_s"})
        if self.profile.time_warmup == 1:
            del profile["time_warmup"]
        canonical = json.dumps(
            {"argv": self.argv, "profile": profile},
            sort_keys=True,
            separators=(",", ":"),
        )
        return "cmd-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]
