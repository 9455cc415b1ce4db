"""Which shard holds a namespace: rendezvous (highest-random-weight) hashing, and the namespace rule.

A namespace names a set of buffers, regions and runs that live together on one shard (one `segfuse
serve` process). A request names its namespace in the `Segfuse-Namespace` header; without the header it
is in the namespace "default". The ingress reads the header to pick the shard; the shard reads it again
to pick the namespace's own runtime (scaleout/shard.py), so namespaces that share a shard stay apart.

Rendezvous hashing rather than a ring: each namespace goes to the shard with the highest
weight(shard, namespace), so adding or removing a shard moves only the namespaces that shard wins or
held, and no ring of virtual nodes needs tuning. blake2b, not Python's `hash`: the choice must agree
across processes and restarts (PYTHONHASHSEED randomises `hash` of str).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

NAMESPACE_HEADER = "Segfuse-Namespace"
DEFAULT_NAMESPACE = "default"
# 1-63 characters: letters, digits, '.', '_', '-', starting with a letter or digit (a DNS label's
# length, and safe in a header, a log line and a file name).
NAMESPACE_RULE = "1-63 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class NamespaceError(ValueError):
    """A bad Segfuse-Namespace header; the message names the header and the rule."""


def parse_namespace(value: str | None) -> str:
    """The namespace a header value names: DEFAULT_NAMESPACE for None (no header)."""
    if value is None:
        return DEFAULT_NAMESPACE
    if not _NAMESPACE.fullmatch(value):
        raise NamespaceError(f"header {NAMESPACE_HEADER} is {value[:80]!r}: a namespace is {NAMESPACE_RULE}")
    return value


def weight(shard: str, namespace: str) -> int:
    # The separator keeps ("ab", "c") and ("a", "bc") apart; a shard id has no NUL in it.
    digest = hashlib.blake2b(f"{shard}\0{namespace}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def shard_for(namespace: str, shards: Iterable[str]) -> str:
    """The shard (one of `shards`, ids such as "shard-0") that holds `namespace`."""
    best = max(shards, key=lambda s: (weight(s, namespace), s), default=None)
    if best is None:
        raise ValueError("no shards to route to")
    return best
