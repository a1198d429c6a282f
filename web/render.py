"""The pages' Jinja environment, one for the routes and for the run page built ahead of its
views (``web.page_parts``, which the analysis worker runs): the same filters and escapes
wherever a template is rendered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import jinja2.nodes
import markupsafe
from fastapi.templating import Jinja2Templates

from web import figures

TEMPLATES_DIR = Path(__file__).parent / "templates"

env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
    autoescape=True,  # every name from a trace is untrusted text (C++ templates contain < >)
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates = Jinja2Templates(env=env)


def _fmt_ms(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _fmt_signed(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:+,.{digits}f}"


_jinja_tojson = env.filters["tojson"]


@jinja2.pass_eval_context
def _tojson(eval_ctx: jinja2.nodes.EvalContext, value: Any, indent: int | None = None) -> Any:
    """Jinja's ``tojson`` (sorted keys, the same HTML-safe escapes) written by orjson
    (``figures.html_json``): a run page's figures are ~2.5 MB of JSON, which the standard
    library took ~100 ms to write."""
    if indent is not None:
        return _jinja_tojson(eval_ctx, value, indent)
    return markupsafe.Markup(figures.html_json(value))


env.filters["ms"] = _fmt_ms
env.filters["signed"] = _fmt_signed
env.filters["tojson"] = _tojson
