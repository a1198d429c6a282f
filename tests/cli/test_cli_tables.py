"""The CLI's light text table (``cptrace/commands/_tables.py``) against rich's own ``Table``.

Where the table fits the console, its lines are rich's lines (the report reads as it did);
where it does not, every line fits and a long name is wrapped, never cut.
"""

from __future__ import annotations

import io
from typing import Literal

from rich.console import Console
from rich.table import Table

from cptrace.commands._tables import MIN_WIDTH, TextTable

KERNEL = (
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"
    "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)"
)
ROWS = [
    ("0", "te_fused_attn_bwd", "[bold]compute[/]", "44.038"),
    ("1", "(unattributed)", "", "3.231"),
    ("12", "cp_p2p_send_recv fwd step 0", "[dim]... 9 more (--json)[/]", "-"),
]


def _print(table: object, width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table)
    return [line.rstrip() for line in out.getvalue().splitlines()]


def _both(title: str) -> tuple[Table, TextTable]:
    ours = TextTable(title=title)
    theirs = Table(title=title, title_justify="left")
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("rank", "right"), ("helper", "left"), ("part", "left"), ("ms", "right"),
    )  # fmt: skip
    for col, justify in columns:
        ours.add_column(col, justify=justify)
        theirs.add_column(col, justify=justify)
    for row in ROWS:
        ours.add_row(*row)
        theirs.add_row(*row)
    return theirs, ours


def test_a_table_that_fits_prints_as_rich_prints_it() -> None:
    theirs, ours = _both("arm:auto_clone: helpers, per step (total / steps)")
    assert _print(ours, 200) == _print(theirs, 200)
    lines = _print(ours, 200)
    assert lines[4].startswith("│    0 │ te_fused_attn_bwd ") and lines[4].endswith("│ 44.038 │")
    assert "compute" in lines[4] and "[bold]" not in "\n".join(lines)  # markup applied


def test_a_long_title_stays_on_one_line() -> None:
    title = "whole trace: uncatalogued NVTX / record_function ranges (totals)"
    _, ours = _both(title)
    assert _print(ours, 200)[0] == title


def test_a_table_wider_than_the_console_wraps_names_and_cuts_nothing() -> None:
    table = TextTable(title="Kernels")
    table.add_column("count", justify="right")
    table.add_column("name", overflow="fold")
    table.add_row("12", KERNEL)
    table.add_row("3", "short\nsecond line")
    width = 60
    lines = _print(table, width)
    assert max(len(line) for line in lines) <= width
    body = [line for line in lines if line.startswith("│")]
    name_cells = "".join(line.split("│")[2].strip() for line in body[:-2])
    assert name_cells.replace(" ", "") == KERNEL.replace(" ", "")  # every character kept
    assert body[-2].split("│")[2].strip() == "short"
    assert body[-1].split("│")[2].strip() == "second line"


def test_many_columns_shrink_to_the_minimum_first_then_below_it() -> None:
    table = TextTable()
    for i in range(6):
        table.add_column(f"column {i}", justify="right")
    table.add_row(*(f"{i * 1234.5678:.3f}" for i in range(6)))
    lines = _print(table, 80)
    widths = [len(cell) - 2 for cell in lines[0].strip("┏┓").split("┳")]
    assert min(widths) == MIN_WIDTH and max(len(line) for line in lines) <= 80
    lines = _print(table, 40)  # below the minimum: every cell still whole, over more lines
    assert max(len(line) for line in lines) <= 40
    body = [line.strip("│").split("│") for line in lines if line.startswith("│")]
    cells = ["".join(parts[i].strip() for parts in body) for i in range(6)]
    assert cells == [f"{i * 1234.5678:.3f}" for i in range(6)]


def test_a_row_longer_than_the_columns_is_refused() -> None:
    table = TextTable()
    table.add_column("only")
    try:
        table.add_row("a", "b")
    except ValueError as exc:
        assert "2 cells for 1 columns" in str(exc)
    else:
        raise AssertionError("a row of two cells for one column was accepted")
