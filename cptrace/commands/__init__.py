"""One module per command group; each defines ``register(app: typer.Typer) -> None``."""
