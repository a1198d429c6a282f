"""The packed-layout contract lives in ``contracts.packing`` (torch-free, shared with the spec);
re-exported here for the runners' code."""

from contracts.packing import *  # noqa: F403
from contracts.packing import PackedLayout, build_layout  # noqa: F401
