"""cptrace's profiling bootstrap: Python runs this at startup in every child of ``cptrace profile``.

``cptrace profile`` puts this directory, and only this directory, first on the children's
``PYTHONPATH`` (never on its own ``sys.path``), so every Python process of the job (the script,
torchrun's workers, srun's tasks) imports it before the job's code. It only installs hooks; what
they do is configured by environment variables set for the children:

* ``CPTRACE_STATUS_DIR``: rank status for failure diagnosis, and ``faulthandler`` armed so the
  watchdog can ask for every thread's stack (``runners.profile.rankstatus``);
* ``CPTRACE_STEPS``: every step of the job timed (``runners.profile.steps``);
* ``CPTRACE_TORCH_PROFILE``: the PyTorch profiler stepped by the job
  (``runners.profile.torchprof``);
* ``CPTRACE_PROBE``: the metadata probe (``runners.profile.probe``).

The user's modules always win over cptrace's. The job may have its own packages named like
ours (``tests``, ``contracts``, ``runners``, ``cptrace``, ...) in its script directory, on its
``PYTHONPATH`` or in site-packages. So cptrace's tree is put at the *end* of ``sys.path`` (after
all of those; the script directory is prepended after this file ran), and the hooks are
imported from it with the tree briefly first, then every module of cptrace's packages that this
import loaded is taken back out of ``sys.modules``: the installed hooks keep their module
objects, and the job's own ``import contracts`` finds the job's package, not a cached one of
ours. (The rank-side modules therefore import all they need of ours at load time, never later
inside a hook.)

Launcher processes (torchrun's agent) and multiprocessing helpers get no hooks: they run no
training step and must not claim a rank. A ``sitecustomize`` that this one shadows (a site's
own, or the user's on their ``PYTHONPATH``) is still executed afterwards.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch", "torchrun")
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
"""cptrace's tree: ``<root>/runners/profile/bootstrap`` is this directory."""
_OUR_PACKAGES = frozenset(
    ("analyzers", "contracts", "cp_attention", "cptrace", "pr_bot", "runners", "service", "web")
)


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
    """Run the ``sitecustomize`` this file hides, if any (the user's, site-packages' or a
    distro's)."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _install_hooks() -> None:
    """Import the hooks from cptrace's tree and install them, leaving no module of cptrace's
    packages in ``sys.modules`` (see the module docstring: the job's own packages win)."""
    before = set(sys.modules)
    sys.path.insert(0, _ROOT)
    try:
        from runners.profile import probe, rankstatus, steps, torchprof

        rankstatus.install_from_environment()
        steps.install_from_environment()
        torchprof.install_from_environment()
        probe.install_from_environment()
    finally:
        sys.path.remove(_ROOT)  # the first occurrence: the one inserted above
        for name in [n for n in sys.modules if n not in before]:
            if name.partition(".")[0] in _OUR_PACKAGES:
                del sys.modules[name]


def _bootstrap() -> None:
    # Last on the path: the job's script directory, PYTHONPATH and site-packages come first, so
    # a job that imports ``cp_attention`` from a source checkout still finds it.
    if _ROOT not in sys.path:
        sys.path.append(_ROOT)
    if _role() == "rank":
        _install_hooks()


_bootstrap()
_chain_shadowed()
