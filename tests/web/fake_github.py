"""A local stand-in for the GitHub REST endpoints the PR comment uses, recording every request.

Threaded ``http.server`` on 127.0.0.1 and a free port; nothing leaves the machine. It implements
issue-comment listing with ``Link`` pagination, comment creation and update, and commit statuses,
with GitHub's status codes and JSON shapes (only the fields cptrace reads).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_LIST = re.compile(r"^/repos/([^/]+/[^/]+)/issues/(\d+)/comments$")
_PATCH = re.compile(r"^/repos/([^/]+/[^/]+)/issues/comments/(\d+)$")
_STATUS = re.compile(r"^/repos/([^/]+/[^/]+)/statuses/([0-9a-fA-F]+)$")


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
    per_page_max: int = 100
    comments: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    next_id: int = 1000
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

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
            return parts.path, parse_qs(parts.query), body

        def do_GET(self) -> None:
            got = self._record()
            if got is None:
                return
            path, query, _ = got
            match = _LIST.match(path)
            if not match:
                self._send(404, {"message": "Not Found"})
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
                    match.group(1), int(match.group(2)), body["body"], "cptrace"
                )
                self._send(
                    201,
                    {"id": cid, "body": body["body"], "html_url": f"https://github.test/c/{cid}"},
                )
            elif match := _STATUS.match(path):
                if body.get("state") not in ("error", "failure", "pending", "success"):
                    self._send(422, {"message": "Validation Failed"})
                    return
                state.statuses.append({"repo": match.group(1), "sha": match.group(2), **body})
                self._send(201, {"id": len(state.statuses), **body})
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
