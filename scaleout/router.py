"""The router in front of the shards: an HAProxy configuration that sends each request straight to
the shard holding its namespace, and the requests every shard must see (registrations, removals,
the model repository's load/unload) to a control endpoint that fans them out, with `/metrics` and
`/v2/health/ready`, which speak for all shards.

HAProxy picks the shard itself: the shard function (client/sharding.py) is rendezvous hashing on
XXH32, which HAProxy's `xxh32(<seed>)` converter computes, so the configuration holds one rule per
shard with that shard's seed and no code of ours runs in the data path. A request without the
`Segfuse-Namespace` header is in the namespace "default"; a malformed one is routed all the same
and its shard answers 400. The shard set is the configured one: a shard that is down answers 503
(HAProxy's own) rather than having its namespaces move to a shard without their data.

    text = haproxy_config({"shard-0": ("127.0.0.1", 8101), ...}, ("0.0.0.0", 8000), ("127.0.0.1", 8100))
    haproxy -f router.cfg           # (HAProxy 2.6+, e.g. Debian's package)
"""

from __future__ import annotations

from .routing import NAMESPACE_HEADER, broadcast_routes, seed

DEFAULT_TIMEOUT_S = 300  # client and server inactivity: a large upload or a long run is one request
# Requests the control endpoint answers for every shard (besides the broadcast routes)
CONTROL_ROUTES = [("GET", r"/metrics"), ("GET", r"/v2/health/ready")]


def haproxy_config(shards: dict[str, tuple[str, int]], listen: tuple[str, int], control: tuple[str, int],
                   timeout_s: int = DEFAULT_TIMEOUT_S, max_connections: int = 4096) -> str:
    """An HAProxy configuration: `listen` (host, port) is the public address; `shards` maps each shard
    id to the (host, port) of its HTTP server; `control` is the (host, port) of the fan-out endpoint."""
    if not shards:
        raise ValueError("the router needs at least one shard")
    ids = sorted(shards)  # the order shard_for breaks ties in: the first of equal weights wins
    backends = {sid: f"shard_{k}" for k, sid in enumerate(ids)}
    header = NAMESPACE_HEADER.lower()
    lines = [
        "global",
        f"    maxconn {max_connections}",
        "defaults",
        "    mode http",
        "    option http-keep-alive",
        "    timeout connect 5s",
        f"    timeout client {timeout_s}s",
        f"    timeout server {timeout_s}s",
        "    timeout http-request 30s",
        "frontend segfuse",
        f"    bind {_address(listen)}",
    ]
    # The namespace, then the rendezvous: the highest xxh32(namespace, seed(shard)), ties to the first.
    lines += [
        f"    http-request set-var(txn.ns) req.hdr({header})",
        f"    http-request set-var(txn.ns) str(default) unless {{ req.hdr({header}) -m found }}",
        f"    http-request set-var(txn.shard) str({backends[ids[0]]})",
        f"    http-request set-var(txn.best) var(txn.ns),xxh32({seed(ids[0])})",
    ]
    for sid in ids[1:]:
        name = backends[sid]
        lines += [
            f"    http-request set-var(txn.w) var(txn.ns),xxh32({seed(sid)})",
            f"    http-request set-var(txn.shard) str({name}) if {{ var(txn.w),sub(txn.best) -m int gt 0 }}",
            f"    http-request set-var(txn.best) var(txn.w) if {{ var(txn.shard) -m str {name} }}",
        ]
    for method, pattern in broadcast_routes() + CONTROL_ROUTES:
        lines.append(f"    use_backend control if {{ method {method} }} {{ path_reg ^{pattern}$ }}")
    lines.append("    use_backend %[var(txn.shard)]")
    lines += ["backend control", f"    server control {_address(control)}"]
    for sid in ids:
        lines += [f"backend {backends[sid]}", f"    server {_server_name(sid)} {_address(shards[sid])}"]
    return "\n".join(lines) + "\n"


def _address(hp: tuple[str, int]) -> str:
    host, port = hp
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be 1-65535, not {port!r}")
    if any(c.isspace() for c in host) or not host:
        raise ValueError(f"bad host {host!r}")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _server_name(sid: str) -> str:
    if not sid or not all(c.isalnum() or c in "-_." for c in sid):
        raise ValueError(f"a shard id is letters, digits, '-', '_' and '.', not {sid!r}")
    return sid
