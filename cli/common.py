"""What the command modules share: the user-error type (exit status 2), loading a graph file, and
NAME=VALUE pairs."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the command line or its files: printed, exit status 2."""


def load_graph(path: str):
    from segfuse.compiler import load_fusion

    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    return load_fusion(text)


def parse_pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for it in items:
        name, sep, path = it.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--{what} expects NAME=FILE, got '{it}'")
        out[name] = path
    return out
