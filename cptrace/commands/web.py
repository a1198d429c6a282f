"""``cptrace pr-comment`` and ``cptrace screenshots``: thin wrappers over ``pr_bot`` and ``web``.

httpx, playwright and the web package are imported inside the commands, so ``cptrace`` starts on
a GPU host that has none of them. Library errors (``GitHubError``, ``CommentError``,
``ScreenshotError``) become ``CommandError`` here and nowhere else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from cptrace.errors import CommandError

DEFAULT_SERVER = "http://127.0.0.1:8000"


def _fetch_comparison(
    server: str, base: int, head: int, base_window: str | None, head_window: str | None
) -> dict[str, Any]:
    """The comparison page's JSON twin: the report plus both runs' summaries."""
    import httpx

    from pr_bot.labels import compare_url

    url = f"{server.rstrip('/')}{compare_url(base, head, base_window, head_window)}"
    url = url.replace(f"/compare/{base}/{head}", f"/compare/{base}/{head}.json", 1)
    token = os.environ.get("CPTRACE_TOKEN", "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(url, headers=headers, timeout=120)
    except httpx.HTTPError as exc:
        raise CommandError(f"cannot reach the cptrace server at {server}: {exc}") from exc
    if response.status_code != 200:
        try:
            detail = response.json().get("error", response.text)
        except ValueError:
            detail = response.text
        raise CommandError(f"GET {url} answered {response.status_code}: {detail}")
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
    from analyzers.report import ComparisonReport
    from pr_bot.comment import CommentContext, CommentError, render_comment
    from pr_bot.deltas import HostTimeRow
    from pr_bot.github import GitHubConfig, GitHubError
    from pr_bot.labels import compare_url
    from pr_bot.publish import publish

    if post and (not repo or pr is None):
        raise typer.BadParameter("--post needs --repo OWNER/NAME and --pr N")
    page = _fetch_comparison(server, base, head, base_window, head_window)
    report = ComparisonReport.model_validate(page["report"])
    # A side without GPU activity: the page's host-time rows (``pr_bot.deltas.host_rows_for``,
    # computed by the server from both reports), as the service's PR loop passes them.
    host = page.get("host")
    host_rows = None if not host else [HostTimeRow.model_validate(r) for r in host["rows"]]
    link_root = (public_url or server).rstrip("/")
    context = CommentContext(
        suite=suite,
        base_name=_label(page["base"], base_window),
        head_name=_label(page["head"], head_window),
        comparison_url=link_root + compare_url(base, head, base_window, head_window),
        base_failure=_failure(page.get("base_failure")),
        head_failure=_failure(page.get("head_failure")),
    )
    try:
        if not post:
            typer.echo(render_comment(report, context, host_rows=host_rows), nl=False)
            return
        head_sha = page["head"].get("commit") if status else None
        if status and not head_sha:
            raise CommandError(f"run {head} has no commit sha to set a status on")
        published = publish(
            report, context, repo=repo or "", pr=pr or 0, config=GitHubConfig.from_env(),
            head_sha=head_sha, host_rows=host_rows,
        )  # fmt: skip
    except (CommentError, GitHubError) as exc:
        raise CommandError(str(exc)) from exc
    where = published.comment.url or f"comment {published.comment.comment_id}"
    typer.echo(f"{published.comment.action} {where} on {repo}#{pr}")
    if published.status_state:
        typer.echo(f"commit status {published.status_state} on {head_sha}")


def _failure(view: dict[str, Any] | None) -> Any:
    """A side's failure record from the comparison twin (``base_failure``/``head_failure``)."""
    from analyzers.manifest import FailureRecord

    return None if not view else FailureRecord.model_validate(view["record"])


def _label(run: dict[str, Any], window: str | None) -> str:
    from pr_bot.labels import run_label

    return run_label(int(run["id"]), str(run["name"]), run.get("commit"), window)


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
