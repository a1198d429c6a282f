"""A local stand-in for the GitHub REST endpoints cptrace uses, recording every request.

Threaded ``http.server`` on 127.0.0.1 and a free port; nothing leaves the machine. It implements
issue-comment listing with ``Link`` pagination, comment creation and update, commit statuses,
``GET /user``, the contents API and the compare API (both read a real local bare git repository
with ``git``), pull requests, collaborator permissions, and canned failures (5xx, secondary rate
limits) queued by the test, with GitHub's status codes and JSON shapes (only the fields cptrace
reads). :func:`send_webhook` signs and delivers a webhook the way GitHub does.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import httpx

_LIST = re.compile(r"^/repos/([^/]+/[^/]+)/issues/(\d+)/comments$")
_PATCH = re.compile(r"^/repos/([^/]+/[^/]+)/issues/comments/(\d+)$")
_STATUS = re.compile(r"^/repos/([^/]+/[^/]+)/statuses/([0-9a-fA-F]+)$")
_CHECK_RUNS = re.compile(r"^/repos/([^/]+/[^/]+)/check-runs$")
_CONCLUSIONS = ("action_required", "cancelled", "failure", "neutral", "success", "skipped",
                "stale", "timed_out")  # fmt: skip
_CONTENTS = re.compile(r"^/repos/([^/]+/[^/]+)/contents/(.+)$")
_COMPARE = re.compile(r"^/repos/([^/]+/[^/]+)/compare/([0-9a-fA-F]+)\.\.\.([0-9a-fA-F]+)$")
_PULL = re.compile(r"^/repos/([^/]+/[^/]+)/pulls/(\d+)$")
_PERMISSION = re.compile(r"^/repos/([^/]+/[^/]+)/collaborators/([^/]+)/permission$")


@dataclass
class Canned:
    """One queued answer: the next request whose method and path match gets it instead."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    method: str | None = None
    path_re: str | None = None


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class FakeGitHub:
    """State of the fake: comments per (repo, issue), statuses, and the request log."""

    token: str = "test-token"
    login: str = "cptrace-bot"
    """The token's own user: comments it creates carry this login."""
    per_page_max: int = 100
    comments: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    check_runs: list[dict[str, Any]] = field(default_factory=list)
    app_token: bool = False
    """Whether the token is a GitHub App's: only those may create check runs (else 403)."""
    requests: list[Recorded] = field(default_factory=list)
    git_dirs: dict[str, Path] = field(default_factory=dict)
    """repo -> a bare git repository the contents and compare APIs read."""
    pulls: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    permissions: dict[tuple[str, str], str] = field(default_factory=dict)
    canned: list[Canned] = field(default_factory=list)
    next_id: int = 1000
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail_next(
        self,
        status: int,
        *,
        method: str | None = None,
        path_re: str | None = None,
        headers: dict[str, str] | None = None,
        message: str = "Server Error",
    ) -> None:
        """Queue a failure for the next matching request (e.g. 502, or 403 + Retry-After)."""
        with self.lock:
            self.canned.append(
                Canned(status, {"message": message}, headers or {}, method, path_re)
            )

    def take_canned(self, method: str, path: str) -> Canned | None:
        with self.lock:
            for i, canned in enumerate(self.canned):
                if (canned.method in (None, method)) and (
                    canned.path_re is None or re.search(canned.path_re, path)
                ):
                    return self.canned.pop(i)
        return None

    def statuses_for(self, sha: str) -> list[dict[str, Any]]:
        return [s for s in self.statuses if s["sha"] == sha]

    def bodies(self, repo: str, issue: int) -> list[str]:
        return [c["body"] for c in self.comments.get((repo, issue), [])]

    def add_comment(self, repo: str, issue: int, body: str, user: str = "someone") -> int:
        with self.lock:
            self.next_id += 1
            self.comments.setdefault((repo, issue), []).append(
                {
                    "id": self.next_id,
                    "body": body,
                    "user": {"login": user},
                    "html_url": f"https://github.test/{repo}/pull/{issue}#c{self.next_id}",
                }
            )
            return self.next_id


def _handler(state: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _record(self) -> tuple[str, dict[str, list[str]], Any] | None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            state.requests.append(
                Recorded(
                    self.command,
                    parts.path,
                    parse_qs(parts.query),
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
            )
            if self.headers.get("Authorization") != f"Bearer {state.token}":
                self._send(401, {"message": "Bad credentials"})
                return None
            canned = state.take_canned(self.command, parts.path)
            if canned is not None:
                self._send(canned.status, canned.body, canned.headers)
                return None
            return parts.path, parse_qs(parts.query), body

        def _git(self, repo: str, *args: str) -> subprocess.CompletedProcess[bytes] | None:
            git_dir = state.git_dirs.get(repo)
            if git_dir is None:
                return None
            return subprocess.run(
                ["git", "--git-dir", str(git_dir), *args], capture_output=True, check=False
            )

        def _get_other(self, path: str, query: dict[str, list[str]]) -> None:
            if path == "/user":
                self._send(200, {"login": state.login, "type": "Bot"})
            elif match := _CONTENTS.match(path):
                ref = query.get("ref", ["HEAD"])[0]
                name = unquote(match.group(2))
                got = self._git(match.group(1), "show", f"{ref}:{name}")
                if got is None or got.returncode != 0:
                    self._send(404, {"message": "Not Found"})
                    return
                content = base64.b64encode(got.stdout).decode()
                self._send(200, {"type": "file", "encoding": "base64", "content": content})
            elif match := _COMPARE.match(path):
                got = self._git(match.group(1), "merge-base", match.group(2), match.group(3))
                if got is None or got.returncode != 0:
                    self._send(404, {"message": "Not Found"})
                    return
                self._send(200, {"merge_base_commit": {"sha": got.stdout.decode().strip()}})
            elif match := _PULL.match(path):
                pull = state.pulls.get((match.group(1), int(match.group(2))))
                self._send(200, pull) if pull else self._send(404, {"message": "Not Found"})
            elif match := _PERMISSION.match(path):
                role = state.permissions.get((match.group(1), match.group(2)), "read")
                self._send(200, {"permission": role, "role_name": role})
            else:
                self._send(404, {"message": "Not Found"})

        def do_GET(self) -> None:
            got = self._record()
            if got is None:
                return
            path, query, _ = got
            match = _LIST.match(path)
            if not match:
                self._get_other(path, query)
                return
            key = (match.group(1), int(match.group(2)))
            per_page = min(int(query.get("per_page", ["30"])[0]), state.per_page_max)
            page = int(query.get("page", ["1"])[0])
            items = state.comments.get(key, [])
            chunk = items[(page - 1) * per_page : page * per_page]
            headers = {}
            if page * per_page < len(items):
                nxt = f"{state.url}{path}?per_page={per_page}&page={page + 1}"
                headers["Link"] = f'<{nxt}>; rel="next", <{state.url}{path}?page=1>; rel="first"'
            self._send(200, chunk, headers)

        def do_POST(self) -> None:
            got = self._record()
            if got is None:
                return
            path, _, body = got
            if match := _LIST.match(path):
                if not isinstance(body, dict) or not isinstance(body.get("body"), str):
                    self._send(422, {"message": "Validation Failed"})
                    return
                if len(body["body"]) > 65536:
                    self._send(422, {"message": "body is too long (maximum is 65536 characters)"})
                    return
                cid = state.add_comment(
                    match.group(1), int(match.group(2)), body["body"], state.login
                )
                self._send(
                    201,
                    {
                        "id": cid,
                        "body": body["body"],
                        "user": {"login": state.login},
                        "html_url": f"https://github.test/c/{cid}",
                    },
                )
            elif match := _STATUS.match(path):
                if body.get("state") not in ("error", "failure", "pending", "success"):
                    self._send(422, {"message": "Validation Failed"})
                    return
                state.statuses.append({"repo": match.group(1), "sha": match.group(2), **body})
                self._send(201, {"id": len(state.statuses), **body})
            elif match := _CHECK_RUNS.match(path):
                if not state.app_token:
                    self._send(403, {"message": "Resource not accessible by personal access token"})
                    return
                completed = body.get("status") == "completed"
                if not isinstance(body.get("name"), str) or completed != (
                    body.get("conclusion") in _CONCLUSIONS
                ):
                    self._send(422, {"message": "Validation Failed"})
                    return
                state.check_runs.append({"repo": match.group(1), **body})
                self._send(201, {"id": len(state.check_runs), **body})
            else:
                self._send(404, {"message": "Not Found"})

        def do_PATCH(self) -> None:
            got = self._record()
            if got is None:
                return
            path, _, body = got
            match = _PATCH.match(path)
            if not match:
                self._send(404, {"message": "Not Found"})
                return
            cid = int(match.group(2))
            for items in state.comments.values():
                for comment in items:
                    if comment["id"] == cid:
                        if len(body["body"]) > 65536:
                            self._send(422, {"message": "body is too long"})
                            return
                        comment["body"] = body["body"]
                        self._send(200, comment)
                        return
            self._send(404, {"message": "Not Found"})

    return Handler


class FakeGitHubServer:
    """Context manager: start the fake on a free loopback port, stop it on exit."""

    def __init__(self, state: FakeGitHub | None = None) -> None:
        self.state = state or FakeGitHub()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.state.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return self.state.url

    def __enter__(self) -> FakeGitHub:
        self._thread.start()
        return self.state

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def sign(secret: str, body: bytes) -> str:
    """GitHub's ``X-Hub-Signature-256`` header value for ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def send_webhook(
    url: str,
    secret: str,
    event: str,
    payload: dict[str, Any],
    *,
    delivery: str | None = None,
    signature: str | None = None,
) -> httpx.Response:
    """POST a webhook the way GitHub does: JSON body, event and delivery headers, HMAC.

    ``signature`` overrides the computed one (to send a wrong one).
    """
    body = json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": signature if signature is not None else sign(secret, body),
        "User-Agent": "GitHub-Hookshot/test",
    }
    return httpx.post(url, content=body, headers=headers, timeout=30)
