"""Run-bundle reading: valid bundles (dir, tar, tar.gz) and every kind of hostile member."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from analyzers.bundle import (
    BUNDLE_VERSION,
    BundleError,
    UnsafeBundleError,
    is_bundle,
    read_bundle,
)

SYNTHETIC = "synthetic-h200x2"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest(traces: list[dict[str, object]], **extra: object) -> dict[str, object]:
    return {
        "bundle_version": BUNDLE_VERSION,
        "schema_version": 1,
        "run": {"name": "test", "spec": {}},
        "workload": {"implementation": "te", "cp_size": 2},
        "variants": [{"name": "a", "window": "arm:a", "facts": {"pad_between_seqs": None}}],
        "traces": traces,
        **extra,
    }


@pytest.fixture()
def bundle_dir(tmp_path: Path, data_dir: Path) -> Path:
    """A valid directory bundle holding the two real synthetic Kineto traces."""
    root = tmp_path / "bundle"
    (root / "traces").mkdir(parents=True)
    entries = []
    for rank in (0, 1):
        src = data_dir / SYNTHETIC / f"kineto_rank{rank}.json.gz"
        shutil.copyfile(src, root / "traces" / src.name)
        entries.append(
            {
                "path": f"traces/{src.name}",
                "format": "kineto",
                "rank": rank,
                "sha256": _sha(src.read_bytes()),
            }
        )
    (root / "manifest.json").write_text(json.dumps(_manifest(entries)))
    return root


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], *, gz: bool) -> Path:
    with tarfile.open(path, "w:gz" if gz else "w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _members_of(root: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out.append((tarfile.TarInfo(p.relative_to(root).as_posix()), p.read_bytes()))
    return out


def test_directory_bundle_reads_and_verifies(bundle_dir: Path) -> None:
    with read_bundle(bundle_dir) as bundle:
        assert bundle.bundle_version == 1
        assert [t.rank for t in bundle.traces] == [0, 1]
        assert bundle.analysis_paths() == [
            bundle_dir / "traces" / "kineto_rank0.json.gz",
            bundle_dir / "traces" / "kineto_rank1.json.gz",
        ]
        assert bundle.manifest.variants[0].window == "arm:a"
        assert bundle.run.name == "test"
    assert bundle_dir.exists(), "closing a directory bundle must not delete it"


@pytest.mark.parametrize("gz", [True, False])
def test_tar_bundle_extracts_and_cleans_up(tmp_path: Path, bundle_dir: Path, gz: bool) -> None:
    archive = _tar(tmp_path / ("b.tar.gz" if gz else "b.tar"), _members_of(bundle_dir), gz=gz)
    extract = tmp_path / "extract"
    extract.mkdir()
    assert is_bundle(archive)
    with read_bundle(archive, extract_to=extract) as bundle:
        assert all(t.path.is_file() for t in bundle.traces)
        assert bundle.root.is_relative_to(extract)
    assert list(extract.iterdir()) == []


def test_tar_with_one_top_level_folder(tmp_path: Path, bundle_dir: Path) -> None:
    members = [(tarfile.TarInfo(f"run1/{i.name}"), d) for i, d in _members_of(bundle_dir)]
    archive = _tar(tmp_path / "b.tar.gz", members, gz=True)
    with read_bundle(archive) as bundle:
        assert [t.member for t in bundle.traces] == [
            "traces/kineto_rank0.json.gz",
            "traces/kineto_rank1.json.gz",
        ]
        assert all(t.path.is_file() for t in bundle.traces)


def _hostile(tmp_path: Path, bundle_dir: Path, extra: tarfile.TarInfo, data: bytes | None) -> Path:
    return _tar(tmp_path / "bad.tar.gz", [*_members_of(bundle_dir), (extra, data)], gz=True)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("../escape.txt", r"'\.\.' leaves the bundle"),
        ("/etc/evil", "absolute path"),
        ("traces/../../x", r"'\.\.' leaves the bundle"),
    ],
)
def test_path_traversal_member_is_refused(
    tmp_path: Path, bundle_dir: Path, name: str, message: str
) -> None:
    archive = _hostile(tmp_path, bundle_dir, tarfile.TarInfo(name), b"x")
    extract = tmp_path / "extract"
    extract.mkdir()
    with pytest.raises(UnsafeBundleError, match=message):
        read_bundle(archive, extract_to=extract)
    assert list(extract.iterdir()) == [], "a refused bundle leaves nothing behind"
    assert not (tmp_path / "escape.txt").exists()


def test_huge_member_name_is_refused_without_echoing_it(
    tmp_path: Path, bundle_dir: Path
) -> None:
    name = "traces/" + "n" * (1 << 20)  # a 1 MiB name (a pax header carries it)
    archive = _hostile(tmp_path, bundle_dir, tarfile.TarInfo(name), b"x")
    extract = tmp_path / "extract"
    extract.mkdir()
    with pytest.raises(UnsafeBundleError, match="over the 1024-character limit") as caught:
        read_bundle(archive, extract_to=extract)
    assert len(str(caught.value)) < 400 + len(str(archive))
    assert list(extract.iterdir()) == []


@pytest.mark.parametrize(
    ("kind", "word"),
    [
        (tarfile.SYMTYPE, "link"),
        (tarfile.LNKTYPE, "link"),
        (tarfile.CHRTYPE, "special file"),
        (tarfile.FIFOTYPE, "special file"),
    ],
)
def test_links_and_devices_are_refused(
    tmp_path: Path, bundle_dir: Path, kind: bytes, word: str
) -> None:
    info = tarfile.TarInfo("traces/link.json.gz")
    info.type = kind
    info.linkname = "/etc/passwd"
    archive = _hostile(tmp_path, bundle_dir, info, None)
    with pytest.raises(UnsafeBundleError, match=f"is a {word}"):
        read_bundle(archive)


def test_symlink_in_directory_bundle_is_refused(bundle_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret.json.gz"
    shutil.copyfile(bundle_dir / "traces" / "kineto_rank1.json.gz", outside)
    target = bundle_dir / "traces" / "kineto_rank1.json.gz"
    target.unlink()
    target.symlink_to(outside)
    with pytest.raises(UnsafeBundleError, match="symbolic link"):
        read_bundle(bundle_dir)


def test_oversized_member_is_refused(tmp_path: Path, bundle_dir: Path) -> None:
    archive = _hostile(tmp_path, bundle_dir, tarfile.TarInfo("logs/huge.log"), b"x" * 5000)
    with pytest.raises(UnsafeBundleError, match="over the 4096-byte cap"):
        read_bundle(archive, max_member_bytes=4096)


def test_total_size_cap(tmp_path: Path, bundle_dir: Path) -> None:
    archive = _tar(tmp_path / "b.tar.gz", _members_of(bundle_dir), gz=True)
    with pytest.raises(UnsafeBundleError, match="add up to more than"):
        read_bundle(archive, max_total_bytes=40_000)


def test_duplicate_member_is_refused(tmp_path: Path, bundle_dir: Path) -> None:
    members = _members_of(bundle_dir)
    archive = _tar(tmp_path / "b.tar.gz", [*members, members[-1]], gz=True)
    with pytest.raises(UnsafeBundleError, match="appears twice"):
        read_bundle(archive)


def test_sha256_mismatch_is_refused(bundle_dir: Path) -> None:
    trace = bundle_dir / "traces" / "kineto_rank0.json.gz"
    trace.write_bytes(trace.read_bytes() + b"tampered")
    with pytest.raises(BundleError, match=r"kineto_rank0.json.gz: sha256 .* does not match"):
        read_bundle(bundle_dir)


def _edit_manifest(root: Path, **changes: object) -> None:
    path = root / "manifest.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bundle_version": 99}, "bundle_version 99 is newer"),
        ({"bundle_version": "1"}, "field bundle_version: expected an integer"),
        ({"traces": []}, "field traces: expected a non-empty list"),
        (
            {
                "traces": [
                    {
                        "path": "traces/nope.json.gz",
                        "format": "kineto",
                        "rank": 0,
                        "sha256": "0" * 64,
                    }
                ]
            },
            "traces/nope.json.gz is listed but missing",
        ),
        (
            {
                "traces": [
                    {
                        "path": "traces/kineto_rank0.json.gz",
                        "format": "perfetto",
                        "rank": 0,
                        "sha256": "0" * 64,
                    }
                ]
            },
            r"traces.0.format: expected one of",
        ),
        (
            {
                "traces": [
                    {
                        "path": "traces/kineto_rank0.json.gz",
                        "format": "kineto",
                        "rank": -1,
                        "sha256": "0" * 64,
                    }
                ]
            },
            r"traces.0.rank: expected",
        ),
        ({"variants": [{"name": "a", "facts": {"cu_seqlens": [1, 2]}}]}, "field variants.0.facts"),
    ],
)
def test_invalid_manifest_fields_are_named(
    bundle_dir: Path, changes: dict[str, object], message: str
) -> None:
    _edit_manifest(bundle_dir, **changes)
    with pytest.raises(BundleError, match=message):
        read_bundle(bundle_dir)


def test_unlisted_trace_is_refused(bundle_dir: Path) -> None:
    (bundle_dir / "traces" / "extra.json.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(BundleError, match=r"traces/extra\.json\.gz is in the bundle but not"):
        read_bundle(bundle_dir)


def test_trace_path_escaping_directory_bundle(bundle_dir: Path) -> None:
    _edit_manifest(
        bundle_dir,
        traces=[{"path": "../outside.json.gz", "format": "kineto", "rank": 0, "sha256": "0" * 64}],
    )
    with pytest.raises(UnsafeBundleError, match=r"'\.\.' leaves the bundle"):
        read_bundle(bundle_dir)


def test_not_a_tar(tmp_path: Path) -> None:
    bogus = tmp_path / "x.tar.gz"
    bogus.write_bytes(b"\x1f\x8bnot really gzip")
    with pytest.raises(BundleError, match="not a readable tar archive"):
        read_bundle(bogus)


def test_missing_manifest(tmp_path: Path, bundle_dir: Path) -> None:
    members = [(i, d) for i, d in _members_of(bundle_dir) if i.name != "manifest.json"]
    with pytest.raises(BundleError, match=r"no manifest\.json"):
        read_bundle(_tar(tmp_path / "b.tar.gz", members, gz=True))
