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

import re

import orjson
from segfuse.server.errors import error_body

from .routing import NAMESPACE_HEADER, SHARD_HEADER, broadcast_routes, seed

DEFAULT_TIMEOUT_S = 300  # client and server inactivity: a large upload or a long run is one request
# Requests the control endpoint answers for every shard (besides the broadcast routes)
CONTROL_ROUTES = [("GET", r"/metrics"), ("GET", r"/v2/health/ready")]
SHARD_PREFIX = "/shards"  # /shards/<id>/...: that shard's own API (the SDK's direct mode)
LIVE_PATH = "/v2/health/live"
# The router's own liveness (HAProxy answers it): a probe of the router pods must not fail with a
# shard, which /v2/health/live (the namespace's shard's) and /v2/health/ready (every shard's) would.
ROUTER_LIVE_PATH = "/router/live"
CLIENT_KEEP_ALIVE_S = 5  # `segfuse serve`'s default keep-alive timeout
# HAProxy checks each shard's liveness this often and takes it out after CHECK_FALL failed checks:
# its namespaces then get 503 (Retry-After: 1) at once until it answers again. A shard whose process
# is gone refuses connections, which gives the same 503 even before the check notices.
CHECK_INTERVAL_S = 1
CHECK_FALL = 2
# --busy-poll: the router's one thread polls its sockets without sleeping. On virtual machines a
# sleeping HAProxy wakes 30-100 us late per request (HAProxy's own documentation; seen on loopback):
# a core held whole buys that latency back. One thread, as a spinning thread per core would take
# every core from the shards.
# A connection the shard refuses takes it out at once, not at the next checks, as does a connection
# it drops: its namespaces get the 503 from the first failure on.
_MARK_DOWN = "observe layer4 error-limit 1 on-error mark-down"


def backends(ids) -> dict[str, str]:
    """Shard id -> the name of its backend in the configuration (its server is named as the shard)."""
    return {sid: f"shard_{k}" for k, sid in enumerate(sorted(ids))}


def haproxy_config(shards: dict[str, tuple[str, int]], listen: tuple[str, int], control: tuple[str, int],
                   timeout_s: int = DEFAULT_TIMEOUT_S, max_connections: int = 4096, admin_socket: str | None = None,
                   client_keep_alive_s: float | None = None, busy_polling: bool = False) -> str:
    """An HAProxy configuration: `listen` (host, port) is the public address; `shards` maps each shard
    id to the (host, port) of its HTTP server; `control` is the (host, port) of the fan-out endpoint.
    `admin_socket`: a Unix socket path for HAProxy's runtime API, through which `set_address` moves a
    shard to a new address without a reload (a reload would close clients' idle keep-alive
    connections, and a client's next request on one would fail). `busy_polling`: one HAProxy thread
    that never sleeps (a core held for lower latency per request)."""
    if not shards:
        raise ValueError("the router needs at least one shard")
    ids = sorted(shards)  # the order shard_for breaks ties in: the first of equal weights wins
    backends_of = backends(ids)
    header = NAMESPACE_HEADER.lower()
    lines = [
        "global",
        f"    maxconn {max_connections}",
        *([f"    stats socket {admin_socket} mode 600 level admin"] if admin_socket else []),
        *(["    nbthread 1", "    busy-polling"] if busy_polling else []),
        "defaults",
        "    mode http",
        "    option http-keep-alive",
        # No retries: HAProxy waits a turnaround (up to a second) before it tries the same shard
        # again, and a shard that refuses connections is down (taken out at once, below), so its
        # requests get the 503 now. A request sent on a kept-alive connection the shard dropped (it
        # died) gets the connection closed, as from a crashed `segfuse serve`: the SDK sends a GET,
        # PUT or DELETE again. (Shards keep idle connections longer than HAProxy does, so they never
        # drop one under a request otherwise.)
        "    retries 0",
        "    timeout connect 5s",
        "    timeout check 10s",
        f"    timeout client {timeout_s}s",
        f"    timeout server {timeout_s}s",
        "    timeout http-request 30s",
        # A client's idle connection closes here first, with the shard connection it holds; the
        # shards keep theirs open longer (cluster.py), so none closes under a request on its way.
        f"    timeout http-keep-alive {_ms(client_keep_alive_s or CLIENT_KEEP_ALIVE_S)}",
        "frontend segfuse",
        f"    bind {_address(listen)}",
        f"    monitor-uri {ROUTER_LIVE_PATH}",  # HAProxy's own answer: the router is up, whatever the shards
    ]
    # The namespace, then the rendezvous: the highest xxh32(namespace, seed(shard)), ties to the first.
    lines += [
        f"    http-request set-var(txn.ns) req.hdr({header})",
        f"    http-request set-var(txn.ns) str(default) unless {{ req.hdr({header}) -m found }}",
        f"    http-request set-var(txn.shard) str({backends_of[ids[0]]})",
        f"    http-request set-var(txn.best) var(txn.ns),xxh32({seed(ids[0])})",
    ]
    for sid in ids[1:]:
        name = backends_of[sid]
        lines += [
            f"    http-request set-var(txn.w) var(txn.ns),xxh32({seed(sid)})",
            f"    http-request set-var(txn.shard) str({name}) if {{ var(txn.w),sub(txn.best) -m int gt 0 }}",
            f"    http-request set-var(txn.best) var(txn.w) if {{ var(txn.shard) -m str {name} }}",
        ]
    # The SDK's direct mode: /shards/<id>/... is that shard's, below the prefix (and not broadcast:
    # a direct client sends a registration to every shard itself).
    for sid in ids:
        on = f"{{ path_beg {SHARD_PREFIX}/{sid}/ }}"
        lines += [
            f"    http-request set-var(txn.shard) str({backends_of[sid]}) if {on}",
            f"    http-request set-var(txn.direct) bool(true) if {on}",
            f"    http-request replace-path {SHARD_PREFIX}/{re.escape(sid)}(/.*) \\1 if {on}",
        ]
    for method, pattern in broadcast_routes() + CONTROL_ROUTES:
        lines.append(f"    use_backend control if !{{ var(txn.direct) -m bool }} {{ method {method} }} "
                     f"{{ path_reg ^{pattern}$ }}")
    lines.append("    use_backend %[var(txn.shard)]")
    lines += ["backend control", f"    option httpchk GET {LIVE_PATH}",
              _unavailable("the control endpoint of the router", ["router", "control"]),
              f"    server control {_address(control)} check inter {CHECK_INTERVAL_S}s fall {CHECK_FALL} rise 1"]
    dns = any(not _is_ip(h) for h, _ in shards.values())
    if dns:  # shards named by host name (Kubernetes: a StatefulSet's pods): followed as their address changes
        lines += ["resolvers dns", "    parse-resolv-conf", "    hold valid 2s", "    hold obsolete 5s"]
    server_dns = " resolvers dns init-addr last,libc,none" if dns else ""
    for sid in ids:
        lines += [f"backend {backends_of[sid]}",
                  f"    option httpchk GET {LIVE_PATH}",
                  f"    http-response set-header {SHARD_HEADER} {sid}",
                  _unavailable(f"shard {sid}", ["shards", sid]),
                  f"    server {_server_name(sid)} {_address(shards[sid])} "
                  f"check inter {CHECK_INTERVAL_S}s fall {CHECK_FALL} rise 1 {_MARK_DOWN}"
                  f"{server_dns if not _is_ip(shards[sid][0]) else ''}"]
    return "\n".join(lines) + "\n"


def set_address(admin_socket: str, ids, sid: str, host: str, port: int, timeout_s: float = 5.0) -> None:
    """Point shard `sid`'s server at host:port through HAProxy's runtime API (no reload; its health
    check brings it back into service once the new address answers)."""
    import socket

    _address((host, port))
    command = f"set server {backends(ids)[sid]}/{_server_name(sid)} addr {host} port {port}\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(admin_socket)
        s.sendall(command.encode())
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    text = reply.decode(errors="replace").strip()
    if "changed" not in text and "no need to change" not in text:
        raise RuntimeError(f"HAProxy did not move {sid} to {host}:{port}: {text}")


def _unavailable(what: str, loc: list) -> str:
    """HAProxy's 503 (no server up) in segfuse's error format, with Retry-After: the SDK retries."""
    message = f"{what} is unavailable (down or restarting); send the request again"
    body = orjson.dumps(error_body(message, [{"loc": loc, "msg": message}])).decode()
    if "'" in body:
        raise ValueError(f"a quote in {what!r}")
    return f"    http-error status 503 content-type application/json string '{body}' hdr Retry-After 1"


def _is_ip(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _ms(seconds: float) -> str:
    if not seconds > 0:
        raise ValueError(f"a timeout must be above 0 s, not {seconds!r}")
    return f"{max(1, round(seconds * 1000))}ms"


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
