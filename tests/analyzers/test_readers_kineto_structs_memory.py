"""The struct path decodes each chunk where it lies (issue 28, the Kineto read).

A chunk used to be joined from the blocks, sliced at its cut and wrapped in ``[`` ``]`` before
``msgspec`` saw it: three copies of every megabyte, 0.03-0.04 s of a 0.25-0.3 s read of a
reference rank. Now one buffer holds the text and the decoder reads a view of it, so the memory
the read allocates stays well under twice the trace's text (the events of a chunk, the rows,
one buffer); with the copies it was 2.6x on this trace.
"""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

from testkit import DATA_DIR

from analyzers.readers import _files, kineto
from analyzers.readers._kineto_structs import read_structs

TRACE = DATA_DIR / "openworld" / "kineto_sdpa_single_gpu.json.gz"  # 4.1 MB of JSON


def test_the_read_allocates_less_than_twice_the_text() -> None:
    text = len(gzip.decompress(TRACE.read_bytes()))
    blocks = list(_files.file_blocks(Path(TRACE), 1 << 40))  # inflated before measuring
    tables = kineto._Tables()
    header: dict[str, object] = {}
    tracemalloc.start()
    try:
        read_structs(iter(blocks), header, kineto._struct_sink(tables))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tables.count("ranges") and "traceEvents" not in header  # it did read the trace
    assert peak < 2 * text, (peak, text)
