"""A training-step function that takes a set time (``--step-function paced_step:step``)."""

from __future__ import annotations

import time

import torch


def step(ms: float) -> float:
    x = torch.randn(32, 32)
    time.sleep(ms / 1000)
    return float((x @ x).sum())
