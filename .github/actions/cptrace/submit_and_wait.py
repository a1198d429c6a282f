"""Submit a commit's cptrace suites to the service and wait (bounded) for the verdict.

Used by the composite action next to this file; standard library only, so it runs on any
GitHub-hosted or self-hosted runner without installing anything. Exit status: 0 success or
neutral (no baseline), 1 a regression or a failed job (when --fail-on-regression), 2 timed
out or the service refused the request.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

DONE = {"published", "superseded", "error"}


def _call(server: str, token: str, method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        f"{server.rstrip('/')}/api/v1{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"null")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--token", required=True, help="a cptrace CI token of the repository")
    parser.add_argument("--repo", required=True)
    parser.add_argument("--sha", required=True)
    parser.add_argument("--pr", type=int, default=None)
    parser.add_argument("--head-ref", default=None)
    parser.add_argument("--base-sha", default=None)
    parser.add_argument("--base-ref", default=None)
    parser.add_argument("--clone-url", default=None)
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--poll-s", type=float, default=15.0)
    parser.add_argument("--fail-on-regression", action="store_true")
    args = parser.parse_args(argv)
    body = {
        "repo": args.repo,
        "head_sha": args.sha,
        "pr": args.pr,
        "head_ref": args.head_ref or None,
        "base_sha": args.base_sha or None,
        "base_ref": args.base_ref or None,
        "clone_url": args.clone_url or None,
    }
    try:
        batches = _call(args.server, args.token, "POST", "/github/batches", body)
    except urllib.error.HTTPError as exc:
        print(f"cptrace: the service refused the batch ({exc.code}): {exc.read().decode()}")
        return 2
    except urllib.error.URLError as exc:
        print(f"cptrace: cannot reach {args.server}: {exc.reason}")
        return 2
    if not batches:
        print(f"cptrace: no suites to run at {args.sha[:12]} (no .cptrace.yml?)")
        return 0
    print(f"cptrace: {len(batches)} suite(s) queued: " + ", ".join(b["suite"] for b in batches))
    deadline = time.monotonic() + args.timeout_s
    pending = {b["id"]: b for b in batches}
    results: dict[int, dict[str, Any]] = {}
    while pending:
        for batch_id in list(pending):
            batch = _call(args.server, args.token, "GET", f"/github/batches/{batch_id}")
            if batch["status"] in DONE:
                results[batch_id] = pending.pop(batch_id) | batch
        if not pending:
            break
        if time.monotonic() + args.poll_s > deadline:
            names = ", ".join(b["suite"] for b in pending.values())
            print(f"cptrace: timed out after {args.timeout_s:.0f} s waiting for {names}")
            return 2
        time.sleep(args.poll_s)
    bad = False
    for batch in results.values():
        state = batch.get("state") or batch["status"]
        where = batch.get("comment_url") or ""
        print(f"cptrace: {batch['suite']}: {state} {where}".rstrip())
        bad = bad or state in ("failure", "error", "inconclusive")  # never green
    return 1 if bad and args.fail_on_regression else 0


if __name__ == "__main__":
    sys.exit(main())
