"""numpy for the commands that analyse: imported with OpenBLAS held to one thread.

Why: OpenBLAS starts a thread per core when its library loads, and they spin while the
process starts up: about 0.05 s of CPU in a ~0.06 s import on a 2-core machine, taken from the
analysis on a shared one. cptrace's analysis does no BLAS work that threads would speed up.
The variable is set only around the import, so the jobs ``cptrace run`` and ``cptrace profile``
start later see the user's environment as it was; a value the user set is kept.
"""

from __future__ import annotations

import os
import sys

BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"


def import_numpy() -> None:
    """Import numpy (once) with one OpenBLAS thread unless the environment says otherwise."""
    if "numpy" in sys.modules:
        return
    ours = BLAS_THREADS_ENV not in os.environ  # else the user's own setting applies
    if ours:
        os.environ[BLAS_THREADS_ENV] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        if ours:
            del os.environ[BLAS_THREADS_ENV]
