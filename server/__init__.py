"""segfuse's REST service (KServe v2 style): `create_app(settings)` builds the FastAPI app."""

try:
    from importlib.metadata import version as _version

    __version__ = _version("segfuse")
except Exception:  # running from a source tree that is not installed
    __version__ = "0.0.0"


def create_app(settings=None):
    from .app import create_app as _create_app

    return _create_app(settings)


__all__ = ["__version__", "create_app"]
