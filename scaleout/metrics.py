"""Prometheus text of several segfuse runtimes as one exposition: every sample gets labels naming where
it came from (`shard`, `namespace`), and each metric family's HELP and TYPE lines appear once, its
samples from every source together (the text format wants a family's samples contiguous).

A shard merges its namespaces' runtimes (labels shard and namespace); the router's control endpoint merges the shards'
texts (already labelled: no labels added). A label a sample carries already is not added again: a
shard's runtime labels `segfuse_gpu_info` with its shard itself (server/metrics.py), the same value. Per-source samples, not sums: sum them in the query
(`sum by (outcome) (segfuse_runs_total)`), and a restarted shard's counters restart from zero as
Prometheus expects of one source.
"""

from __future__ import annotations

import re

_SAMPLE = re.compile(rb"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL = re.compile(rb'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"(?:[^"\\]|\\.)*"\s*,?')


def _names(line: bytes, start: int) -> set[bytes]:
    """The label names of the label set opening at line[start] ('{')."""
    names, pos = set(), start + 1
    while (m := _LABEL.match(line, pos)) is not None:
        names.add(m.group(1))
        pos = m.end()
    return names


def _labelled(line: bytes, labels: list[tuple[bytes, bytes]]) -> bytes:
    """A sample line with `labels` ([(b'shard', b'shard="shard-0"'), ...]) first in its label set,
    but for those it has already."""
    if not labels:
        return line
    name = _SAMPLE.match(line)
    if name is None:
        return line
    end = name.end()
    if line[end:end + 1] == b"{":
        have = _names(line, end)
        extra = b",".join(pair for k, pair in labels if k not in have)
        if not extra:
            return line
        rest = line[end + 1:]
        return line[:end] + b"{" + extra + (b"" if rest.startswith(b"}") else b",") + rest
    return line[:end] + b"{" + b",".join(pair for _, pair in labels) + b"}" + line[end:]


def merge(sources: list[tuple[dict[str, str], bytes]]) -> bytes:
    """One exposition from (labels, Prometheus text) pairs. Label values here are shard ids and
    namespaces (their rule allows no quote or backslash)."""
    families: dict[bytes, list[list[bytes]]] = {}  # name -> [[HELP/TYPE lines], [samples]]
    for labels, text in sources:
        extra = [(k.encode(), f'{k}="{v}"'.encode()) for k, v in labels.items()]
        family = None
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith(b"#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in (b"HELP", b"TYPE"):
                    family = families.setdefault(parts[2], [[], []])
                    if not any(h.split(None, 2)[1] == parts[1] for h in family[0]):
                        family[0].append(line)
                continue
            if family is None:  # a sample before any HELP/TYPE: a family of its own name
                family = families.setdefault(_SAMPLE.match(line).group(0), [[], []])
            family[1].append(_labelled(line, extra))
    out = []
    for head, samples in families.values():
        out += head + samples
    return b"\n".join(out) + b"\n"
