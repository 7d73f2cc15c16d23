"""`ramforge serve`: the Ollama and OpenAI HTTP APIs over one budgeted model (the `serve` extra).

    >>> from ramforge.server import create_app, ServerConfig           # doctest: +SKIP
    >>> app = create_app(ServerConfig(model="default", ram="512M"))     # doctest: +SKIP

Importing this package is light: FastAPI and uvicorn are imported only by `create_app` and by the
`serve` command when it runs, so `ramforge` works without the extra installed.
"""
from __future__ import annotations


def __getattr__(name):
    if name in ("create_app", "ServerConfig"):
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module 'ramforge.server' has no attribute {name!r}")


__all__ = ["create_app", "ServerConfig"]
