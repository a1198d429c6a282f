"""Pure trace-analysis library: readers, attribution, metrics, findings, comparison.

No web, CLI or GPU dependency. Input: trace files (and an optional run manifest). Output: the
pydantic models of :mod:`analyzers.report`.
"""
