"""segfuse's REST service (KServe v2 style): `create_app(settings)` builds the FastAPI app."""

from .version import __version__


def create_app(settings=None):
    from .app import create_app as _create_app

    return _create_app(settings)


__all__ = ["__version__", "create_app"]
