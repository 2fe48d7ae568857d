"""``nmt-serve``: translation over HTTP (``server``: listening and shutting down; ``app``: the routes; ``batcher``:
the lines of concurrent requests decoded together; ``service``: a request read and translated; ``config``: the
settings; ``openapi``: the schema).

Its public names are importable from the package itself (``from nmtkit.serve import serve, ServeConfig``), each looked
up in its module on first use.
"""

from nmtkit.runtime import lazy_names

__all__, __getattr__ = lazy_names(__name__, {
    "serve": "server", "ServeConfig": "config", "TranslationService": "service", "make_app": "app",
})
