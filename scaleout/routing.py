"""Which shard holds a namespace, and the namespace rule: re-exported from `segfuse.client.sharding`,
where the SDK's direct sharded mode uses the same functions (the client sits below scaleout in the
layer map, so the facts live there and the router imports them).

The router reads the `Segfuse-Namespace` header to pick the shard; the shard reads it again to pick
the namespace's own runtime (scaleout/shard.py), so namespaces that share a shard stay apart.
"""

from __future__ import annotations

from segfuse.client.sharding import (
    DEFAULT_NAMESPACE,
    NAMESPACE_HEADER,
    NAMESPACE_RULE,
    SHARD_HEADER,
    NamespaceError,
    broadcast_outcome,
    broadcast_routes,
    is_broadcast,
    parse_namespace,
    seed,
    shard_for,
    shard_ids,
    weight,
)

__all__ = ["DEFAULT_NAMESPACE", "NAMESPACE_HEADER", "NAMESPACE_RULE", "SHARD_HEADER", "NamespaceError",
           "broadcast_outcome", "broadcast_routes", "is_broadcast", "parse_namespace", "seed", "shard_for", "shard_ids", "weight"]
