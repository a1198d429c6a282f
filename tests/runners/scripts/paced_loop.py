"""``--steps`` calls of ``paced_step.step``, ``--ms`` each: a job whose speed the test sets."""

from __future__ import annotations

import argparse

import paced_step

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--ms", type=float, default=4.0)
args = parser.parse_args()
for _ in range(args.steps):
    paced_step.step(args.ms)
