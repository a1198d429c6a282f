"""Hide credentials in text that leaves a host: log tails, failure summaries, bundle logs.

One rule for every place that publishes text a job produced (the agent before it uploads, the
service before it stores a job's log tail): the caller's own secrets by value, and anything
shaped like a credential: GitHub tokens (``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_``,
``github_pat_``), cptrace tokens (``cpt_``), AWS access key ids and secret keys, and the value
of an ``Authorization: Bearer`` / ``token`` header. Below every package (``contracts``), so the
runners and the service share it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[redacted]"

_SHAPES = re.compile(
    r"""
      \bgh[pousr]_[A-Za-z0-9]{20,}                       # GitHub classic / app / OAuth tokens
    | \bgithub_pat_[A-Za-z0-9_]{20,}                     # GitHub fine-grained tokens
    | \bcpt_[A-Za-z0-9_-]{8,}                            # cptrace tokens, or a part of one
    | \b(?:AKIA|ASIA)[0-9A-Z]{16}\b                      # AWS access key ids
    """,
    re.VERBOSE,
)
# Keep the name, hide the value: "Authorization: Bearer x", "aws_secret_access_key = x".
_LABELLED = re.compile(
    r"""(?ix)
    ( \bbearer\s+
    | \bauthorization["']?\s*[:=]\s*["']?(?:token\s+|basic\s+)?
    | \baws_secret_access_key["']?\s*[:=]\s*["']?
    | \b[A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD)["']?\s*[:=]\s*["']?
    )
    ([A-Za-z0-9._~+/=-]{8,})
    """
)
MIN_SECRET_CHARS = 8
"""Shorter known values are not replaced (an 'x' secret would blank every 'x')."""


def redact_secrets(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with every known secret value and every credential-shaped string replaced."""
    for secret in sorted({s for s in known if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _SHAPES.sub(REDACTED, text)
    return _LABELLED.sub(lambda m: m.group(1) + REDACTED, text)


def looks_secret(text: str) -> bool:
    """Whether ``text`` holds anything :func:`redact_secrets` would hide (tests, checks)."""
    return _SHAPES.search(text) is not None
