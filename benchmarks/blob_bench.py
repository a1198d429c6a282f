"""Blob store throughput on both backends: store (stage + spool + commit) and materialise, MB/s,
and how much the process's peak RSS grew (streamed both ways: far below the blob's size).

stage: the bytes into a temp file in ``tmp/``, hashed. spool: fsync (local) or the multipart
upload to a staging key (S3), which overlaps the validation in a real upload. commit: the rename
(local) or the server-side copy to the digest's key (S3). materialise: the worker's local copy
(a symlink locally; ranged GETs from S3).

The S3 rows need an S3-compatible endpoint and credentials from the usual AWS variables, e.g.
moto's standalone server (in memory, on this machine: a floor for a real store, not AWS)::

    python -m moto.server -p 5055 &
    AWS_ACCESS_KEY_ID=k AWS_SECRET_ACCESS_KEY=s python benchmarks/blob_bench.py \\
        --endpoint http://127.0.0.1:5055 --mib 128

Without ``--endpoint`` only the local folder is measured.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from service.storage.blobs import Blobs, BlobStore, S3BlobStore, S3Location  # noqa: E402

CHUNK = 1 << 20


def _chunks(mib: int, seed: bytes) -> Iterator[bytes]:
    block = os.urandom(CHUNK - len(seed)) + seed  # distinct content per run: no dedupe
    for _ in range(mib):
        yield block


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(name: str, blobs: Blobs, mib: int, scratch: Path) -> dict[str, str]:
    before = _peak_mb()
    started = time.perf_counter()
    pending = blobs.stage_chunks(_chunks(mib, uuid.uuid4().bytes))  # to tmp/, hashed
    stage_s = time.perf_counter() - started
    started = time.perf_counter()
    blobs.spool(pending.path)  # fsync, or the multipart upload to a staging key
    spool_s = time.perf_counter() - started
    started = time.perf_counter()
    stored = blobs.commit(pending.path, pending.sha256, pending.size)  # rename, or S3 copy
    commit_s = time.perf_counter() - started
    put_s = stage_s + spool_s + commit_s
    started = time.perf_counter()
    dest = scratch / f"{name}.bin"
    blobs.materialise(stored.sha256, dest, limit=stored.size)
    size = dest.stat().st_size  # a symlink's target on the local folder
    get_s = time.perf_counter() - started
    assert size == stored.size
    blobs.delete(stored.sha256)
    mb = stored.size / 1e6
    return {
        "backend": name,
        "blob MiB": str(mib),
        "stage s": f"{stage_s:.2f}",
        "spool s": f"{spool_s:.2f}",
        "spool MB/s": f"{mb / spool_s:.0f}",
        "commit s": f"{commit_s:.2f}",
        "store MB/s": f"{mb / put_s:.0f}",
        "materialise s": f"{get_s:.2f}",
        "materialise MB/s": f"{mb / get_s:.0f}",
        "peak RSS growth MB": f"{_peak_mb() - before:.0f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint", help="S3-compatible endpoint URL (moto, MinIO)")
    parser.add_argument("--bucket", default=f"cptrace-bench-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--mib", type=int, default=128, help="blob size in MiB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cptrace-blob-bench-") as root:
        base = Path(root)
        (base / "scratch").mkdir()
        rows = []
        if args.endpoint:  # first, while the process's peak RSS is still low
            s3 = S3BlobStore(S3Location(args.bucket, "bench/", args.endpoint), base / "s3tmp")
            s3.check()
            rows.append(measure("s3", s3, args.mib, base / "scratch"))
        local = BlobStore(base / "blobs", base / "tmp")
        rows.append(measure("local", local, args.mib, base / "scratch"))
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(row[c] for c in columns) + " |")


if __name__ == "__main__":
    main()
