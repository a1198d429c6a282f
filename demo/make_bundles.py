"""Build the demo's trace bundles (``runners.demo_bundles``) into a folder, e.g. to inspect them.

Usage (from the repository root)::

    .venv/bin/python demo/make_bundles.py --out "$TMPDIR/demo" [--traces demo/traces]

``cptrace serve --seed-demo`` builds the same bundles itself; they are not kept in the
repository, whose one copy of these traces is ``demo/traces``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from analyzers.bundle import file_sha256
from runners.demo_bundles import build_trace_bundles, default_demo_traces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=default_demo_traces())
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    for archive in build_trace_bundles(args.out, args.traces):
        print(f"{archive}  {archive.stat().st_size:>9} bytes  sha256 {file_sha256(archive)}")


if __name__ == "__main__":
    main()
