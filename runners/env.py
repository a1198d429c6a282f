"""The software and hardware a run used: versions and GPU models, never environment variables.

Timings only mean something next to the stack that produced them (TE 2.18 vs 2.20 take different
paths; a driver or cuDNN update moves kernel times). What is recorded is an allow-list of facts;
``os.environ`` is never read into the record, because it routinely holds tokens and passwords.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import socket
import subprocess
from typing import Any


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvidia_driver() -> str | None:
    """Driver version from ``nvidia-smi`` (torch does not expose it)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.strip().splitlines()
    return first[0].strip() if first else None


def _torch_facts() -> dict[str, Any]:
    import torch  # lazily: env capture also runs in tests that only need versions

    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        facts["gpu_count"] = count
        facts["gpu_models"] = sorted({torch.cuda.get_device_name(i) for i in range(count)})
        facts["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        facts["cudnn"] = torch.backends.cudnn.version()
        try:
            nccl = torch.cuda.nccl.version()
            facts["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except (AttributeError, RuntimeError):
            facts["nccl"] = None
    else:
        facts.update(gpu_count=0, gpu_models=[], cudnn=None, nccl=None)
    return facts


def capture_environment(*, include_hostname: bool = False) -> dict[str, Any]:
    """Versions of the stack and the GPUs, as a JSON-ready dict for the manifest."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "cpu_arch": platform.machine(),
        "driver": _nvidia_driver(),
        "transformer_engine": _package_version("transformer_engine")
        or _package_version("transformer-engine"),
        "cudnn_frontend": _package_version("nvidia-cudnn-frontend"),
        "cptrace": _package_version("cptrace"),
    }
    env.update(_torch_facts())
    if include_hostname:
        env["hostname"] = socket.gethostname()
    return env
