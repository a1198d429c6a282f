"""Import Transformer Engine so that it binds to the cuDNN that torch ships.

TE's core library links ``libcudnn.so.9``, which resolves to the copy torch already loaded from
the ``nvidia-cudnn`` wheel; cuDNN then ``dlopen``s its sub-libraries (``libcudnn_heuristic``,
``libcudnn_graph``, ...) by bare name, and on hosts with a system cuDNN of another build those
come from ``/lib`` and fail with an undefined-symbol error (seen on the H200 host with TE 2.20.2).
Loading the wheel's sub-libraries first, with RTLD_GLOBAL, makes cuDNN find the matching ones.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path


def preload_wheel_cudnn() -> list[str]:
    """Load every ``libcudnn*.so.9`` of the ``nvidia-cudnn`` wheel globally; return their names."""
    try:
        spec = importlib.util.find_spec("nvidia.cudnn")
    except ModuleNotFoundError:  # no nvidia namespace at all: a CPU-only torch
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    loaded = []
    for location in spec.submodule_search_locations:
        lib_dir = Path(location) / "lib"
        # libcudnn_graph first: the others resolve symbols against it.
        for path in sorted(lib_dir.glob("libcudnn*.so.9"), key=lambda p: "graph" not in p.name):
            try:
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL | os.RTLD_LAZY)
            except OSError:
                continue  # a sub-library this GPU/driver cannot use; cuDNN skips it too
            loaded.append(path.name)
    return loaded


def import_transformer_engine() -> None:
    """Import ``transformer_engine.pytorch`` after pinning cuDNN to torch's copy."""
    import torch  # noqa: F401  (loads libcudnn.so.9 from the wheel first)

    preload_wheel_cudnn()
    import transformer_engine.pytorch  # noqa: F401
