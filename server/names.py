"""The one rule for the names of buffers and shared-memory regions, wherever a request gives one
(path parameters, run outputs and inputs): 1-128 characters of A-Z a-z 0-9 _ . -, matched whole
(`re.fullmatch`: no trailing newline slips through), and not `.` or `..` (path segments that URL
normalisation would eat, so such a buffer could never be read or deleted)."""

from __future__ import annotations

import re

from fastapi import Depends, Path

from .errors import bad_request

NAME_CHARS = r"[A-Za-z0-9_.\-]{1,128}"
NAME_RULE = "1-128 characters of A-Z a-z 0-9 _ . -, and not '.' or '..'"
_NAME = re.compile(NAME_CHARS)
# The same rules as JSON Schema patterns, for the OpenAPI document only (the checks above and
# regions.check_key answer with their own messages); tests/test_openapi.py keeps them in step.
NAME_PATTERN = r"^(?!\.\.?$)[A-Za-z0-9_.\-]{1,128}$"
KEY_PATTERN = r"^/?(?!\.$)(?!.*\.\.)[A-Za-z0-9_.\-]{1,250}$"


def is_valid_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None and name not in (".", "..")


def check_name(name: str, loc: tuple | list, what: str = "buffer") -> str:
    """`name`, or a 400 at `loc` that quotes it (repr: a control character stays visible)."""
    if not is_valid_name(name):
        shown = f"'{name}'" if isinstance(name, str) and name.isprintable() else repr(name)
        raise bad_request(f"{what} name {shown} must be {NAME_RULE}", loc)
    return name


def path_name(what: str, description: str = ""):
    """A route parameter `name: str = path_name(...)`: the `{name}` path parameter, checked by
    `check_name` (400 located at path.name)."""
    def name_param(name: str = Path(description=f"{NAME_RULE}{description}",
                                    json_schema_extra={"pattern": NAME_PATTERN})) -> str:
        return check_name(name, ["path", "name"], what)

    return Depends(name_param)
