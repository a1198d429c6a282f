"""The workload spec contract lives in ``contracts.spec`` (the service validates job specs
without importing the runners); re-exported here for the runners' code and users."""

from contracts.spec import *  # noqa: F403
from contracts.spec import SpecError, layout_for, load_spec, parse_spec  # noqa: F401
