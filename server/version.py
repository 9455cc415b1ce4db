"""The installed package's version (0.0.0 when running from a source tree that is not installed)."""

try:
    from importlib.metadata import version as _version

    __version__ = _version("segfuse")
except Exception:  # not installed: a source tree on PYTHONPATH
    __version__ = "0.0.0"
