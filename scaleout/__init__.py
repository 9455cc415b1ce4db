"""segfuse on several processes: shards (`shard`: a runtime per namespace) behind a router (`router`:
HAProxy's configuration; `control`: what every shard must see), each request routed by its namespace
(`routing`, pure). `cluster` runs them: on one host or, with the `ray` extra, on a Ray cluster."""

from .routing import DEFAULT_NAMESPACE, NAMESPACE_HEADER, NamespaceError, parse_namespace, shard_for

__all__ = ["DEFAULT_NAMESPACE", "NAMESPACE_HEADER", "NamespaceError", "parse_namespace", "shard_for"]
