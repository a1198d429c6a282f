"""``--steps`` calls of ``paced_step.step``: a job whose speed is its code's (``paced_step.MS``).

The test writes ``paced_step.py`` beside a copy of this script, once per commit, so two runs
have the same command line and different code, as a pull request's base and head do.
"""

from __future__ import annotations

import argparse

import paced_step

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
args = parser.parse_args()
for _ in range(args.steps):
    paced_step.step()
