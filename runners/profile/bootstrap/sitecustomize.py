"""cptrace's profiling bootstrap: Python runs this at startup in every child of ``cptrace profile``.

``cptrace profile`` puts this directory first on the children's ``PYTHONPATH`` (never on its own
``sys.path``), so every Python process of the job (the script, torchrun's workers, srun's
tasks) imports it before the job's code. It only installs hooks; what they do is configured by
environment variables set for the children:

* ``CPTRACE_STATUS_DIR``: rank status for failure diagnosis (``runners.profile.rankstatus``);
* ``CPTRACE_TORCH_PROFILE``: the PyTorch profiler stepped by the job
  (``runners.profile.torchprof``);
* ``CPTRACE_PROBE``: the metadata probe (``cptrace.probe``).

Launcher processes (torchrun's agent) and multiprocessing helpers are left alone: they run no
training step and must not claim a rank. A ``sitecustomize`` that this one shadows (a site's
own) is still executed afterwards.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch", "torchrun")


def _role() -> str:
    """``launcher``, ``helper`` or ``rank``, from how this interpreter was started."""
    argv = list(getattr(sys, "orig_argv", []))
    joined = " ".join(argv)
    if "multiprocessing" in joined or "--multiprocessing-fork" in argv:
        return "helper"
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] in _LAUNCHERS:
            return "launcher"
        if os.path.basename(arg) == "torchrun":
            return "launcher"
    return "rank"


def _chain_shadowed() -> None:
    """Run the ``sitecustomize`` this file hides, if any (site-packages or a distro's)."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _bootstrap() -> None:
    if _role() != "rank":
        return
    import cptrace.probe
    from runners.profile import rankstatus, torchprof

    rankstatus.install_from_environment()
    torchprof.install_from_environment()
    cptrace.probe.install_from_environment()


_bootstrap()
_chain_shadowed()
