"""segfuse on several processes: shards of `segfuse serve` behind Ray Serve, each request routed by
its namespace (issue 18). `routing` is pure (no Ray); `serve_ray` needs the `ray` extra."""

from .routing import DEFAULT_NAMESPACE, NAMESPACE_HEADER, NamespaceError, parse_namespace, shard_for

__all__ = ["DEFAULT_NAMESPACE", "NAMESPACE_HEADER", "NamespaceError", "parse_namespace", "shard_for"]
