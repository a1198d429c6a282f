"""Exports of what cptrace measured, in other tools' formats (``perfetto``: Chrome trace JSON)."""
