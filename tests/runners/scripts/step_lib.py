"""A training-step function in an importable module, for ``--step-function step_lib:train_step``."""

from __future__ import annotations

import torch


def train_step() -> float:
    x = torch.randn(64, 64)
    with torch.profiler.record_function("my_step_body"):
        return float((x @ x).sum())
