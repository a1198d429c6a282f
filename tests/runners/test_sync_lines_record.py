"""The recorder of the line behind each CUDA sync (``runners/profile/synclines.py``, issue 25).

CUDA's sync debug mode ``warn`` raises c10's warning ``called a synchronizing CUDA operation``
from the Python frame that called into torch; this machine has no GPU, so the warning is raised
here exactly as torch's warning handler raises it (a ``UserWarning`` of that message, from the
caller's frame), with a stand-in for the one ``torch.cuda`` switch (get/set the sync debug
mode). The H200 capture in ``tests/data/plain-h200-profile`` is the recorder driven by real CUDA
(``tests/analyzers/test_sync_lines.py``). With real torch on this CPU-only machine, warn mode is
never switched on.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from testkit import script_module

from analyzers.manifest import SyncLines
from runners.profile.synclines import NO_CUDA, SYNC_WARNING, WARN, SyncLineRecorder

C10_MESSAGE = f"{SYNC_WARNING} (Triggered internally at c10/cuda/CUDAFunctions.cpp:162.)"


class SyncDebugSwitch:
    """``torch.cuda``'s sync debug switch, as an initialised CUDA has it."""

    def __init__(self) -> None:
        self.mode: Any = 0
        self.switched: list[Any] = []

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_sync_debug_mode(self) -> Any:
        return self.mode

    def set_sync_debug_mode(self, mode: Any) -> None:
        self.mode = mode
        self.switched.append(mode)


def _module(path: Path, name: str, source: str) -> ModuleType:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return script_module(path, name)


LIBRARY = f"""import warnings
def synchronize():
    warnings.warn({C10_MESSAGE!r}, UserWarning, stacklevel=1)
"""
USER = f"""import warnings
def check_finite(lib):
    warnings.warn({C10_MESSAGE!r}, UserWarning, stacklevel=1)  # line 3: loss.item()
    lib.synchronize()  # line 4: torch.cuda.synchronize()
"""


@pytest.fixture
def job(tmp_path: Path) -> tuple[ModuleType, ModuleType]:
    lib = _module(tmp_path / "site-packages" / "fakelib.py", "fakelib_sync", LIBRARY)
    user = _module(tmp_path / "job" / "train.py", "train_sync", USER)
    return user, lib


def test_every_sync_is_counted_at_the_users_line(
    tmp_path: Path, job: tuple[ModuleType, ModuleType]
) -> None:
    user, lib = job
    switch = SyncDebugSwitch()
    shown: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # Python's own: a warning once per line
        warnings.showwarning = lambda message, *_rest: shown.append(str(message))
        recorder = SyncLineRecorder(tmp_path / "torch", rank=3)
        recorder.start(switch)
        assert switch.mode == WARN
        for _ in range(5):
            user.check_finite(lib)
        warnings.warn("the job's own warning", UserWarning, stacklevel=1)
        recorder.stop()
        after = warnings.showwarning
    assert switch.switched == [WARN, 0]  # the job's mode is back
    assert shown == ["the job's own warning"]  # the syncs were counted, not printed
    assert after is not recorder._show
    record = json.loads((tmp_path / "torch" / "sync_rank3.json").read_text())
    parsed = SyncLines.model_validate(record)  # what the manifest's contract reads
    assert parsed.rank == 3 and parsed.mode == "warn"
    sites = {(s.line, s.function, s.first_line): s.count for s in parsed.sites}
    # every repeat counted; the library's sync is placed at the user's line that called it
    assert sites == {(3, "check_finite", 2): 5, (4, "check_finite", 2): 5}
    assert {s.file for s in parsed.sites} == {str(tmp_path / "job" / "train.py")}
    assert parsed.sites[0].message == C10_MESSAGE


def test_a_sync_made_by_cptraces_hooks_is_not_the_users(tmp_path: Path) -> None:
    """The step clock reading its CUDA events syncs from ``runners/profile``: not counted."""
    hooks = Path(sys.modules[SyncLineRecorder.__module__].__file__ or "").parent
    recorder = SyncLineRecorder(tmp_path, rank=0)
    with warnings.catch_warnings():
        recorder.start(SyncDebugSwitch())
        code = compile(f"warnings.warn({C10_MESSAGE!r}, UserWarning)", str(hooks / "steps.py"),
                       "exec")  # fmt: skip
        exec(code, {"warnings": warnings, "__name__": "runners.profile.steps"})
        recorder.stop()
    record = recorder.record()
    assert record["sites"] == [] and record["unplaced"] == 1


def test_on_cpu_warn_mode_is_never_switched_on(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    assert not torch.cuda.is_available()
    before = warnings.showwarning
    recorder = SyncLineRecorder(tmp_path, rank=0)
    recorder.start()
    assert warnings.showwarning is before
    recorder.stop()
    record = json.loads((tmp_path / "sync_rank0.json").read_text())
    assert record == {"rank": 0, "mode": NO_CUDA, "sites": [], "dropped": 0, "unplaced": 0}
