"""A light text table for the CLI's reports: rich's look, a fraction of its cost.

Why: ``cptrace analyze`` prints some 40 tables and 5,000 cells for a two-rank trace, and
``rich.table.Table`` measured and wrapped every cell through its general layout engine: about
0.33 s of the command's 0.8 s outside the analysis. These tables are simple (one line per cell
but for the few long names, no nested renderables), so widths are measured once per cell and
each line is written as one string. The box, padding and alignment are rich's defaults
(``box.HEAVY_HEAD``, one space each side), so the output reads as before; a cell is parsed as
rich markup only when it has a ``[``.

When the table is wider than the console, the widest columns give up width first (down to
:data:`MIN_WIDTH`, then, for a table of very many columns, down to one cell) and their cells
wrap: at spaces, and inside a word that is still too long (``fold``): a kernel name is
wrapped, never cut.

Not a command module (no ``register``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

MIN_WIDTH = 8
"""Narrowest a column gets when the table must shrink to the console's width."""


class Justify(StrEnum):
    """Where a column's cells sit: numbers right, words left (rich's names)."""

    LEFT = "left"
    RIGHT = "right"


@dataclass(slots=True)
class _Column:
    header: str
    justify: Justify


@dataclass(slots=True)
class _Cell:
    """One cell: its plain text and, for a cell written in markup, the styled text."""

    plain: str
    styled: Any = None  # rich.text.Text for markup cells, None for plain ones


@dataclass(slots=True)
class TextTable:
    """A table with a title, columns and rows of strings (rich markup allowed in a cell).

    The calls mirror ``rich.table.Table``'s (``add_column(header, justify=)``,
    ``add_row(*cells)``) and ``console.print(table)`` prints it.
    """

    title: str = ""
    columns: list[_Column] = field(default_factory=list)
    rows: list[list[_Cell]] = field(default_factory=list)

    def add_column(self, header: str, justify: str = "left", **_: Any) -> None:
        """A column; extra keywords of rich's signature (``overflow``) are accepted: every
        cell here wraps rather than being cut."""
        self.columns.append(_Column(header, Justify(justify)))

    def add_row(self, *cells: str) -> None:
        if len(cells) > len(self.columns):
            raise ValueError(f"row of {len(cells)} cells for {len(self.columns)} columns")
        row = [_cell(c) for c in cells]
        row += [_Cell("")] * (len(self.columns) - len(row))
        self.rows.append(row)

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.segment import Segment
        from rich.style import Style
        from rich.text import Text

        widths = self._widths(options.max_width)
        if self.title:
            yield from Text(self.title, style="italic").render(console)
            yield Segment.line()
        yield from (Segment(line + "\n") for line in _rules(widths, "┏━┳┓"))
        header = [_Cell(c.header, Text(c.header, style=Style(bold=True))) for c in self.columns]
        yield from _row_lines(console, header, widths, self.columns, "┃")
        yield from (Segment(line + "\n") for line in _rules(widths, "┡━╇┩"))
        for row in self.rows:
            yield from _row_lines(console, row, widths, self.columns, "│")
        yield from (Segment(line + "\n") for line in _rules(widths, "└─┴┘"))

    def _widths(self, max_width: int) -> list[int]:
        """Each column's content width: its widest line, then narrowed to fit ``max_width``."""
        from rich.cells import cell_len

        widths = [
            max([cell_len(col.header)] + [_width(row[i].plain, cell_len) for row in self.rows])
            for i, col in enumerate(self.columns)
        ]
        # borders and padding: "│ a │ b │" is 3 per column plus 1
        excess = sum(widths) + 3 * len(widths) + 1 - max_width
        for floor in (MIN_WIDTH, 1):  # the second pass only for very many columns
            while excess > 0:
                widest = max(range(len(widths)), key=lambda i: widths[i])
                if widths[widest] <= floor:
                    break
                widths[widest] -= 1
                excess -= 1
        return widths


def _cell(value: str) -> _Cell:
    if "[" not in value:
        return _Cell(value)
    from rich.text import Text

    styled = Text.from_markup(value)
    return _Cell(styled.plain, styled)


def _width(plain: str, cell_len: Any) -> int:
    if "\n" not in plain:
        return int(cell_len(plain))
    return max(int(cell_len(line)) for line in plain.split("\n"))


def _rules(widths: Sequence[int], chars: str) -> Iterator[str]:
    left, line, mid, right = chars[0], chars[1], chars[2], chars[3]
    yield left + mid.join(line * (w + 2) for w in widths) + right


def _row_lines(
    console: Any, row: Sequence[_Cell], widths: Sequence[int], columns: Sequence[_Column], bar: str
) -> Iterator[Any]:
    """The physical lines of one row: each cell split at its newlines and wrapped to its
    column, padded and justified; a line without styled cells is one plain string."""
    from rich.segment import Segment

    cells = [_lines(console, cell, w) for cell, w in zip(row, widths, strict=True)]
    height = max(len(c) for c in cells)
    for n in range(height):
        parts: list[Any] = []
        for lines, w, col in zip(cells, widths, columns, strict=True):
            parts.append(_pad(lines[n] if n < len(lines) else "", w, col.justify))
        if all(isinstance(p, str) for p in parts):
            yield Segment(f"{bar} " + f" {bar} ".join(parts) + f" {bar}\n")
            continue
        yield Segment(f"{bar} ")
        for i, part in enumerate(parts):
            if isinstance(part, str):
                yield Segment(part)
            else:
                yield from part.render(console)
            yield Segment(f" {bar}" + (" " if i < len(parts) - 1 else "\n"))


def _lines(console: Any, cell: _Cell, width: int) -> list[Any]:
    """A cell's lines within ``width``: plain strings, or rich Texts for a styled cell."""
    from rich.cells import cell_len

    plain = cell.plain
    if cell.styled is None and "\n" not in plain and cell_len(plain) <= width:
        return [plain]
    from rich.text import Text

    text = cell.styled if cell.styled is not None else Text(plain)
    out: list[Any] = []
    for piece in text.split("\n", allow_blank=True):
        wrapped = piece.wrap(console, width, overflow="fold") if piece.cell_len > width else [piece]
        out.extend(t if cell.styled is not None else t.plain for t in wrapped)
    return out


def _pad(line: Any, width: int, justify: Justify) -> Any:
    """``line`` padded to ``width`` cells, on the left for right-justified columns."""
    if isinstance(line, str):
        from rich.cells import cell_len

        gap = " " * (width - cell_len(line))
        return gap + line if justify is Justify.RIGHT else line + gap
    padded = line.copy()
    gap = width - padded.cell_len
    if justify is Justify.RIGHT:
        padded.pad_left(gap)
    else:
        padded.pad_right(gap)
    return padded


__all__ = ["MIN_WIDTH", "Justify", "TextTable"]
