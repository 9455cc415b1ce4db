"""Which shard holds a namespace: the namespace rule, rendezvous (highest-random-weight) hashing, and
which requests every shard must see. One copy for both sides: the scale-out router (segfuse.scaleout.router)
(segfuse.scaleout, which imports it from here) and the SDK's direct sharded mode (`Client(shards=...)`),
so a client that picks the shard itself reaches the one the router would have picked.

A namespace names a set of buffers, regions and runs that live together on one shard. A request names
its namespace in the `Segfuse-Namespace` header; without the header it is in the namespace "default".

Shards are named `shard-0`..`shard-<N-1>`; in direct mode the i-th URL is `shard-i`. Each namespace
goes to the shard with the highest weight(shard, namespace) = XXH32(namespace, seed = XXH32(shard)),
ties to the smaller id; so adding or removing a shard moves only the namespaces that shard wins or
held. XXH32 because a router computes it too: HAProxy's `xxh32(<seed>)` converter is the same
function, so `haproxy_config` (segfuse.scaleout.router) routes each request with one converter per
shard and no code of ours in the data path. Not Python's `hash`: the choice must agree across
processes and restarts (PYTHONHASHSEED randomises `hash` of str).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import xxhash

NAMESPACE_HEADER = "Segfuse-Namespace"
SHARD_HEADER = "Segfuse-Shard"  # names the shard that answered
DEFAULT_NAMESPACE = "default"
# 1-63 characters: letters, digits, '.', '_', '-', starting with a letter or digit (a DNS label's
# length, and safe in a header, a log line and a file name).
NAMESPACE_RULE = "1-63 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# Requests that change what every namespace can run: fusion registration and removal, the model
# repository's load/unload. Sent to every shard (by the router's control endpoint, or by a direct-mode client).
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


def seed(shard: str) -> int:
    """The shard's XXH32 seed: XXH32 of its id (an unsigned 32-bit number)."""
    return xxhash.xxh32_intdigest(shard.encode())


def weight(shard: str, namespace: str) -> int:
    return xxhash.xxh32_intdigest(namespace.encode(), seed(shard))


def shard_for(namespace: str, shards: Iterable[str]) -> str:
    """The shard (one of `shards`, ids such as "shard-0") that holds `namespace`: the highest weight,
    the smallest id among equal ones (a router compares the same way, in `sorted(shards)` order)."""
    best, best_w = None, -1
    for s in sorted(shards):
        w = weight(s, namespace)
        if w > best_w:
            best, best_w = s, w
    if best is None:
        raise ValueError("no shards to route to")
    return best


def shard_ids(n: int) -> list[str]:
    """The ids of a cluster of `n` shards, in order: shard-0 .. shard-<n-1>."""
    return [f"shard-{i}" for i in range(n)]


def broadcast_routes() -> list[tuple[str, str]]:
    """(method, path regular expression) of each kind of request every shard must see (for a router)."""
    return [(m, p.pattern) for m, p in _BROADCAST]


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
