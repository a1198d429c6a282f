"""Settings of the pull-request loop (environment prefix ``CPTRACE_GITHUB_``; docs/github.md).

The GitHub token itself is read by :class:`pr_bot.github.GitHubConfig` (``GITHUB_TOKEN``,
``GITHUB_API_URL``, ``GITHUB_BOT_LOGIN``), the same variables ``cptrace pr-comment`` uses.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from pr_bot.github import RetryPolicy
from service.github_loop.models import RepoConfig, first_error

MiB = 1024 * 1024


class LoopConfigError(ValueError):
    """The per-repository config file is unreadable or invalid (names the file and field)."""


class LoopSettings(BaseSettings):
    """What the webhook and the publisher need besides the GitHub token."""

    model_config = SettingsConfigDict(env_prefix="CPTRACE_GITHUB_", extra="ignore")

    webhook_secret: SecretStr | None = Field(
        default=None, description="the webhook's secret; without it the endpoint answers 503"
    )
    public_url: str | None = Field(
        default=None, description="this service's public URL, for links in comments and statuses"
    )
    repos_file: Path | None = Field(
        default=None, description="YAML: OWNER/NAME -> per-repository config (RepoConfig)"
    )
    approval_label: str = Field(
        default="cptrace:approved", description="label that approves a fork's pull request"
    )
    approval_command: str = Field(
        default="/cptrace run", description="comment command that approves a fork's head"
    )
    check_runs: bool = Field(
        default=False,
        description="post check runs (Checks API: GitHub App tokens) instead of commit "
        "statuses, so no baseline is 'neutral'; a token that may not falls back to statuses",
    )
    max_payload_bytes: int = Field(
        default=25 * MiB, ge=1024, description="largest webhook body (GitHub sends <= 25 MB)"
    )
    webhook_max_bodies: int = Field(
        default=8, ge=1, description="webhook bodies received at once, before their signature"
    )
    webhook_max_inflight_bytes: int = Field(
        default=64 * MiB, ge=1024, description="bytes those bodies may hold together"
    )
    webhook_body_deadline_s: float = Field(
        default=10.0, gt=0, description="time for a whole webhook body, however it trickles"
    )
    job_max_attempts: int = Field(default=2, ge=1)
    publish_interval_s: float = Field(
        default=2.0, gt=0, description="how often the worker looks for finished batches"
    )
    retry_attempts: int = Field(default=4, ge=1, le=10, description="tries of one GitHub call")
    retry_base_s: float = Field(default=1.0, ge=0, description="first backoff; doubles per try")
    retry_max_s: float = Field(
        default=30.0, ge=0, description="longest backoff, and longest Retry-After honoured"
    )

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            attempts=self.retry_attempts, base_s=self.retry_base_s, max_s=self.retry_max_s
        )

    def repo_configs(self) -> dict[str, RepoConfig]:
        """The per-repository configs (empty when no file is configured)."""
        if self.repos_file is None:
            return {}
        try:
            raw = yaml.safe_load(self.repos_file.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise LoopConfigError(f"{self.repos_file}: cannot read it: {exc}") from exc
        if not isinstance(raw, dict):
            raise LoopConfigError(f"{self.repos_file}: expected a mapping OWNER/NAME -> config")
        configs = {}
        for repo, body in raw.items():
            try:
                configs[str(repo)] = RepoConfig.model_validate(body or {})
            except ValidationError as exc:
                raise LoopConfigError(f"{self.repos_file}: {repo}.{first_error(exc)}") from exc
        return configs

    def repo_config(self, repo: str) -> RepoConfig:
        return self.repo_configs().get(repo) or RepoConfig()
