"""Exceptions for trace input that cannot be analyzed.

Every class derives from ``ValueError`` through ``TraceError`` so callers that only care about
"bad input" catch one type; the service maps each subclass to an HTTP 4xx and the CLI to a
``ClickException``. Messages name the file, the table or field, and what was expected, because
the person reading them usually cannot open the trace themselves.
"""

from __future__ import annotations


class TraceError(ValueError):
    """A trace file could not be turned into a normalized ``Trace``."""


class UnsupportedTraceError(TraceError):
    """The file is readable but is not a format cptrace understands (not nsys, not Kineto)."""


class CorruptTraceError(TraceError):
    """The file claims a supported format but is truncated, malformed or holds no events."""


class HostileTraceError(TraceError):
    """The file carries something that could run code or mislead a reader (triggers, views)."""


class RankConflictError(TraceError):
    """Two trace files claim the same distributed rank."""


class MissingRankError(TraceError):
    """The traces announce more ranks than were given, and all ranks were required."""


class TraceTooLargeError(HostileTraceError):
    """The input expands past a size cap (a gzip bomb, a member over the bundle's limit)."""
