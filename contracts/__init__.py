"""Contracts several rooms share without torch: the workload spec, the packed layout, the version.

This package sits below every other one of ours (it imports nothing of ours but itself), so the
service can validate a job's spec and report its version without importing the runners (torch)
or the CLI. ``runners.spec`` / ``runners.packing`` re-export these modules for the runners' code.
"""
