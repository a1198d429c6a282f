"""The one exception commands raise to stop with a clean ``Error: ...`` line and exit status 1.

Typer >= 0.29 vendors its own copy of Click; a ``click.ClickException`` from the separately
installed ``click`` is then not recognised and surfaces as a traceback. Typer's own
``BadParameter`` always derives from the ``ClickException`` its runner handles, whichever Click
that is, so take the class from there.
"""

from __future__ import annotations

import typer

CommandError: type[Exception] = next(
    cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "ClickException"
)
