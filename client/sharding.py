"""Which shard holds a namespace: the namespace rule, rendezvous (highest-random-weight) hashing, and
which requests every shard must see. One copy for both sides: `segfuse serve-ray`'s ingress
(segfuse.scaleout, which imports it from here) and the SDK's direct sharded mode (`Client(shards=...)`),
so a client that skips the ingress reaches the shard the ingress would have picked.

A namespace names a set of buffers, regions and runs that live together on one shard. A request names
its namespace in the `Segfuse-Namespace` header; without the header it is in the namespace "default".

Shards are named `shard-0`..`shard-<N-1>`; in direct mode the i-th URL is `shard-i`. Each namespace
goes to the shard with the highest weight(shard, namespace), the first 8 bytes of
blake2b(`shard NUL namespace`) read big-endian; so adding or removing a shard moves only the
namespaces that shard wins or held. blake2b, not Python's `hash`: the choice must agree across
processes and restarts (PYTHONHASHSEED randomises `hash` of str).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

NAMESPACE_HEADER = "Segfuse-Namespace"
SHARD_HEADER = "Segfuse-Shard"  # names the shard that answered
DEFAULT_NAMESPACE = "default"
# 1-63 characters: letters, digits, '.', '_', '-', starting with a letter or digit (a DNS label's
# length, and safe in a header, a log line and a file name).
NAMESPACE_RULE = "1-63 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# Requests that change what every namespace can run: fusion registration and removal, the model
# repository's load/unload. Sent to every shard (by the ingress, or by a direct-mode client).
_BROADCAST = [("POST", re.compile(r"/v2/fusions/?")), ("DELETE", re.compile(r"/v2/fusions/[^/]+")),
              ("POST", re.compile(r"/v2/repository/models/[^/]+/(load|unload)"))]


class NamespaceError(ValueError):
    """A bad Segfuse-Namespace header; the message names the header and the rule."""


def parse_namespace(value: str | None) -> str:
    """The namespace a header value names: DEFAULT_NAMESPACE for None (no header)."""
    if value is None:
        return DEFAULT_NAMESPACE
    if not isinstance(value, str) or not _NAMESPACE.fullmatch(value):
        raise NamespaceError(f"header {NAMESPACE_HEADER} is {str(value)[:80]!r}: a namespace is {NAMESPACE_RULE}")
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


def shard_ids(n: int) -> list[str]:
    """The ids of a cluster of `n` shards, in order: shard-0 .. shard-<n-1>."""
    return [f"shard-{i}" for i in range(n)]


def is_broadcast(method: str, path: str) -> bool:
    """Whether a request (its method and path below the server's base URL) goes to every shard."""
    return any(method == m and p.fullmatch(path) for m, p in _BROADCAST)


def broadcast_outcome(statuses: dict[str, int]) -> tuple[int, str] | None:
    """How a request sent to every shard ends, from each shard's status: None when they agree (all
    succeeded, or all failed alike: the namespace's shard's answer stands); else (status, message):
    503 when the only failures are shards that could not be reached (503: restarting; sending the
    request again is safe, a registration of the same graph succeeds again), 502 otherwise."""
    if len(set(statuses.values())) == 1 or all(200 <= st < 300 for st in statuses.values()):
        return None
    listing = ", ".join(f"{s}: {st}" for s, st in statuses.items())
    if all(200 <= st < 300 or st == 503 for st in statuses.values()):
        return 503, f"not every shard could be reached ({listing}); send the request again"
    return 502, f"the shards disagree on this request ({listing}); it may have been applied on some of them"
