"""Which CUDA API calls the readers keep (shared by the nsys and Kineto readers).

Two kinds of calls become rows of ``Trace.launches``: launches (they put work on a GPU and own
the correlation id of that work) and host-synchronising calls (the CPU waits for the GPU; the
step account labels that wait). Every other API call (event records, stream queries, ...) is
dropped. Synchronising rows carry ``sync`` True and never count as launches
(``analyzers.model.launch_calls``).
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from analyzers.model import SymbolTable

LAUNCH_API = re.compile(
    r"^(cudaLaunch(?!HostFunc)\w*|cuLaunch(?!HostFunc)\w*|cudaGraphLaunch\w*|cuGraphLaunch\w*"
    r"|cudaMemcpy\w*|cudaMemset\w*|cuMemcpy\w*|cuMemset\w*)$"
)
"""API calls that put work on a GPU and own the correlation id of that work.

Host functions (``cudaLaunchHostFunc``) run on the CPU and produce no GPU activity.
"""

SYNC_API = re.compile(
    r"^(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cudaThreadSynchronize"
    r"|cuStreamSynchronize|cuCtxSynchronize|cuEventSynchronize)(_ptsz|_ptds)?$"
)
"""API calls that block the host until GPU work finished (no GPU work of their own).

A synchronous ``cudaMemcpy`` blocks too, but it launches a copy: it is a launch.
"""

_VERSION_SUFFIX = re.compile(r"_v\d+$")


def normalize_api(name: str) -> str:
    """Drop the ABI suffix nsys appends (``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``)."""
    return _VERSION_SUFFIX.sub("", name)


def is_launch_api(name: str) -> bool:
    """True for calls whose correlation id links CPU launch to GPU work."""
    return LAUNCH_API.match(normalize_api(name)) is not None


def is_sync_api(name: str) -> bool:
    """True for calls that block the host on the GPU without launching anything."""
    return SYNC_API.match(normalize_api(name)) is not None


def is_kept_api(name: str) -> bool:
    """True for the calls that become rows of ``Trace.launches`` (launches and syncs)."""
    return is_launch_api(name) or is_sync_api(name)


def sync_column(api: npt.NDArray[np.int32], strings: SymbolTable) -> npt.NDArray[np.bool_]:
    """The ``sync`` column of a launches table from its API symbols (one test per API name)."""
    names = np.unique(api)
    syncing = names[[is_sync_api(strings[int(s)]) for s in names.tolist()]]
    out: npt.NDArray[np.bool_] = np.isin(api, syncing)
    return out
