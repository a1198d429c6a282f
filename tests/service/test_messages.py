"""Error text that leaves the server names uploaded files, never server paths or pids."""

from __future__ import annotations

from pathlib import Path

from service.messages import redact


def test_labels_replace_scratch_paths_and_other_data_paths_are_hidden(tmp_path: Path) -> None:
    link = f"{tmp_path}/tmp/analysis-3-4242/trace000-rank0.json.gz"
    text = f"{link}: no events; see {tmp_path}/blobs/ab/cdef and pid 4242"
    out = redact(text, tmp_path, {link: "traces/rank0.json.gz"})
    assert out.startswith("traces/rank0.json.gz: no events")
    assert str(tmp_path) not in out and "4242" not in out
    assert "the uploaded file" in out


def test_text_without_paths_is_unchanged(tmp_path: Path) -> None:
    assert redact("rank must be an integer", tmp_path) == "rank must be an integer"
