"""``cptrace pr-comment`` and ``cptrace screenshots``: thin wrappers over the service and ``web``.

httpx, playwright and the web package are imported inside the commands, so ``cptrace`` starts on
a GPU host that has none of them. The comment is rendered by the service (its PR-comment
endpoint), so the CLI, the endpoint and the comparison page's preview say the same; the CLI only
posts it, under its own ``GITHUB_TOKEN``. Library errors (``GitHubError``, ``ScreenshotError``)
become ``CommandError`` here and nowhere else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from cptrace.errors import CommandError

DEFAULT_SERVER = "http://127.0.0.1:8000"


def _render_on_server(server: str, base: int, head: int, request: dict[str, Any]) -> dict[str, Any]:
    """The service renders the comment (``POST /api/v1/comparisons/{base}/{head}/pr-comment``)."""
    import httpx

    url = f"{server.rstrip('/')}/api/v1/comparisons/{base}/{head}/pr-comment"
    token = os.environ.get("CPTRACE_TOKEN", "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.post(url, json=request, headers=headers, timeout=120)
    except httpx.HTTPError as exc:
        raise CommandError(f"cannot reach the cptrace server at {server}: {exc}") from exc
    if response.status_code != 200:
        try:
            detail = response.json().get("error", response.text)
        except ValueError:
            detail = response.text
        raise CommandError(f"POST {url} answered {response.status_code}: {detail}")
    return dict(response.json())


def pr_comment(
    base: int = typer.Option(..., "--base", min=1, help="Base run id."),
    head: int = typer.Option(..., "--head", min=1, help="Head (candidate) run id."),
    repo: str | None = typer.Option(None, "--repo", help="GitHub repository, OWNER/NAME."),
    pr: int | None = typer.Option(None, "--pr", min=1, help="Pull-request number."),
    post: bool = typer.Option(False, "--post", help="Create or update the comment on GitHub."),
    status: bool = typer.Option(False, "--status", help="Also set a commit status on head's sha."),
    suite: str = typer.Option("default", "--suite", help="One comment per pull request and suite."),
    server: str = typer.Option(
        DEFAULT_SERVER, "--server", envvar="CPTRACE_SERVER", help="cptrace server URL."
    ),
    base_window: str | None = typer.Option(None, "--base-window", help="e.g. arm:auto_clone"),
    head_window: str | None = typer.Option(None, "--head-window", help="e.g. arm:explicit_false"),
    public_url: str | None = typer.Option(
        None, "--public-url", help="Server URL for links in the comment (default: --server)."
    ),
) -> None:
    """Render a comparison as a pull-request comment; print it, or post it with --post.

    The comment carries a hidden marker for the suite, so posting again updates the same
    comment. Posting reads GITHUB_TOKEN (and GITHUB_API_URL for GitHub Enterprise) from the
    environment; reading from the server uses CPTRACE_TOKEN when reads need a token.

    Example: cptrace pr-comment --base 12 --head 15 --repo octo/model --pr 42 --post --status
    """
    from pr_bot.github import GitHubConfig, GitHubError
    from pr_bot.publish import CommitStatus, post_comment

    if post and (not repo or pr is None):
        raise typer.BadParameter("--post needs --repo OWNER/NAME and --pr N")
    request = {"suite": suite, "base_window": base_window, "head_window": head_window,
               "link_root": public_url or server}  # fmt: skip
    rendered = _render_on_server(server, base, head, request)
    if not post:
        typer.echo(rendered["body"], nl=False)
        return
    head_sha = rendered.get("head_commit") if status else None
    if status and not head_sha:
        raise CommandError(f"run {head} has no commit sha to set a status on")
    try:
        published = post_comment(
            rendered["body"], suite=suite, repo=repo or "", pr=pr or 0,
            config=GitHubConfig.from_env(), head_sha=head_sha,
            status=CommitStatus(**rendered["commit_status"]),
        )  # fmt: skip
    except GitHubError as exc:
        raise CommandError(str(exc)) from exc
    where = published.comment.url or f"comment {published.comment.comment_id}"
    typer.echo(f"{published.comment.action} {where} on {repo}#{pr}")
    if published.status_state:
        typer.echo(f"commit status {published.status_state} on {head_sha}")


def screenshots(
    server: str = typer.Option(
        DEFAULT_SERVER, "--server", envvar="CPTRACE_SERVER", help="cptrace server URL."
    ),
    out: Path = typer.Option(Path("docs/screenshots"), "--out", help="Directory for the PNGs."),
    width: int = typer.Option(1400, "--width", min=600, help="Viewport width in pixels."),
) -> None:
    """Save a full-page PNG of every dashboard page of a running server.

    Needs Chromium (Debian: apt-get install chromium). Pages are discovered from the server's
    JSON twins: the newest analysed run, a comparison, its history, the run list, the catalog.

    Example: cptrace screenshots --server http://127.0.0.1:8000 --out docs/screenshots
    """
    from web.screenshots import ScreenshotError, take_screenshots

    try:
        written = take_screenshots(server, out, width=width)
    except ScreenshotError as exc:
        raise CommandError(str(exc)) from exc
    for path in written:
        typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command("pr-comment")(pr_comment)
    app.command("screenshots")(screenshots)
