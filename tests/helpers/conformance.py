"""What the conformance suite compares and how a difference reads in docs/http-api.md.

A case's observation of one server is a flat dict of plain values: HTTP statuses, what tritonclient did
("ok", "raises 400"), results checked against NumPy, and body shapes. A body shape is the set of its JSON paths with
their types ("inputs[].name: str"): keys and types, never values such as names, versions or timings. Sets (shapes,
extension lists) differ item by item: a cell shows what only that server has, as `key: +item`.

The section "Differences from Triton" of docs/http-api.md holds one table row per case whose observations differ,
its Triton and segfuse cells exactly as rendered here, so the suite checks the table both ways."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"
SECTION = "## Differences from Triton"
HEADER = ("case", "Triton 2.51", "segfuse", "why")


def shape(obj, path: str = "") -> frozenset[str]:
    """The JSON paths of `obj` with their types; list elements merge under `[]`; an empty list or object shows."""
    if isinstance(obj, dict):
        if not obj:
            return frozenset({f"{path or '.'}: {{}}"})
        return frozenset().union(*(shape(v, f"{path}.{k}" if path else str(k)) for k, v in obj.items()))
    if isinstance(obj, list):
        if not obj:
            return frozenset({f"{path}: []"})
        return frozenset().union(*(shape(v, f"{path}[]") for v in obj))
    kind = ("null" if obj is None else "bool" if isinstance(obj, bool) else
            "number" if isinstance(obj, (int, float)) else "str" if isinstance(obj, str) else type(obj).__name__)
    return frozenset({f"{path or '.'}: {kind}"})


def body_shape(content: bytes) -> frozenset[str] | str:
    """The shape of a JSON body; "empty" or "not JSON" otherwise."""
    if not content.strip():
        return "empty"
    try:
        return shape(json.loads(content))
    except ValueError:
        return "not JSON"


def _items(value) -> str:
    return " ".join(f"+{v}" for v in sorted(value)) if value else "(nothing more)"


def _plain(value) -> str:
    if isinstance(value, frozenset):
        return "{" + ", ".join(sorted(value)) + "}"
    if isinstance(value, tuple):
        return "(" + ", ".join(map(str, value)) + ")"
    return str(value)


def differences(triton: dict, segfuse: dict) -> tuple[str, str] | None:
    """The (Triton, segfuse) cells of the fields that differ, or None when the observations agree."""
    cells: tuple[list[str], list[str]] = ([], [])
    for key in sorted(set(triton) | set(segfuse)):
        a, b = triton.get(key, "(absent)"), segfuse.get(key, "(absent)")
        if a == b:
            continue
        if isinstance(a, frozenset) and isinstance(b, frozenset):
            a, b = _items(a - b), _items(b - a)
        else:
            a, b = _plain(a), _plain(b)
        cells[0].append(f"`{key}: {a}`")
        cells[1].append(f"`{key}: {b}`")
    if not cells[0]:
        return None
    rendered = (" ".join(cells[0]), " ".join(cells[1]))
    assert not any("|" in c for c in rendered), rendered  # a table cell
    return rendered


@dataclass(frozen=True)
class Row:
    case: str
    triton: str
    segfuse: str
    why: str


def documented(text: str | None = None) -> dict[str, Row]:
    """The rows of the table under "Differences from Triton" in docs/http-api.md, by case."""
    text = DOC.read_text() if text is None else text
    start = text.find("\n" + SECTION + "\n")
    if start < 0:
        return {}
    end = text.find("\n## ", start + len(SECTION) + 2)
    lines = [ln for ln in text[start:end if end > 0 else None].splitlines() if ln.startswith("|")]
    rows: dict[str, Row] = {}
    for ln in lines[2:]:  # past the header and its rule
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", ln.strip())[1:-1]]
        if len(cells) != len(HEADER):
            raise ValueError(f"a row of {len(HEADER)} cells expected: {ln}")
        case = cells[0].strip("`")
        if case in rows:
            raise ValueError(f"two rows for {case!r}")
        rows[case] = Row(case, *cells[1:])
    if lines and tuple(c.strip() for c in lines[0].strip().strip("|").split("|")) != HEADER:
        raise ValueError(f"the table's header must be | {' | '.join(HEADER)} |")
    return rows


def row_text(case: str, cells: tuple[str, str], why: str = "WHY") -> str:
    return f"| `{case}` | {cells[0]} | {cells[1]} | {why} |"
