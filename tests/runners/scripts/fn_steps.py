"""A loop without an optimizer: its steps are calls of ``step_lib.train_step``."""

from __future__ import annotations

import step_lib

for _ in range(5):
    step_lib.train_step()
