"""Where did the step go: a complete per-rank, per-step account of every window's time.

``build`` splits each window into compute, exposed communication, exposed memcpy and idle time
by cause, exactly; ``host`` says what a CPU thread was doing at an instant; ``peers`` aligns
collectives across ranks. The exclusive-share interval arithmetic is ``analyzers.sweep`` (the
GPU timeline's decomposition takes its unions there too, from ``timeline.group_unions``).
"""

from __future__ import annotations

from analyzers.account.build import Accounts, compute_accounts

__all__ = ["Accounts", "compute_accounts"]
