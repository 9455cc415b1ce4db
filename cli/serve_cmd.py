"""`segfuse serve`: the REST service (FastAPI on uvicorn). Flags default to SEGFUSE_* variables."""

from __future__ import annotations

import argparse
import os

from .common import UserError

EPILOG = """environment variables (defaults for the flags): SEGFUSE_HOST, SEGFUSE_PORT, SEGFUSE_GRPC_PORT,
SEGFUSE_METRICS_PORT, SEGFUSE_BACKEND,
SEGFUSE_DEVICE, SEGFUSE_CACHE_DIR, SEGFUSE_FUSION_DIR, SEGFUSE_TOKEN, SEGFUSE_MAX_BODY_BYTES, SEGFUSE_MAX_OPS,
SEGFUSE_MAX_RANK, SEGFUSE_MAX_BUFFER_BYTES, SEGFUSE_MAX_TOTAL_BYTES, SEGFUSE_MAX_REGION_BYTES, SEGFUSE_MAX_REGIONS, SEGFUSE_MAX_QUEUED_RUNS,
SEGFUSE_MAX_FUSIONS, SEGFUSE_MAX_FUSION_BYTES, SEGFUSE_MAX_PLAN_WORK, SEGFUSE_MAX_PLAN_SECONDS,
SEGFUSE_MAX_RUN_BYTES, SEGFUSE_RUN_WORKERS, SEGFUSE_MAX_BATCH,
SEGFUSE_MAX_HEADER_BYTES, SEGFUSE_HEADER_TIMEOUT, SEGFUSE_BODY_TIMEOUT, SEGFUSE_KEEP_ALIVE_TIMEOUT,
SEGFUSE_LOG_LEVEL, SEGFUSE_LOG_FORMAT, SEGFUSE_ACCESS_LOG (1/0, true/false). Sizes take K/M/G suffixes (binary units).

examples:
  segfuse serve --port 8000
  segfuse serve --log-format json     # one JSON object per log line
  segfuse serve --grpc-port 8001      # KServe v2 gRPC beside HTTP (pip install 'segfuse[grpc]')
  segfuse serve --metrics-port 8002   # /metrics also on a port of its own, as Triton's (no token there)
  segfuse serve --access-log          # plus one line per request (off by default, as in Triton)
  segfuse serve --backend cupy --processes 4 --mps   # ports 8000-8003 sharing one GPU under MPS
  segfuse serve --backend cupy --processes 4 --mps --route   # the same shards behind one port, 8000
  SEGFUSE_TOKEN=secret segfuse serve --backend cupy --device 0 --cache-dir /var/cache/segfuse
  curl -s localhost:8000/v2/health/ready
"""


def add_parsers(sub) -> None:
    p = sub.add_parser("serve", help="run the REST service (KServe v2 style)", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--grpc-port", type=int, help="also serve the KServe v2 gRPC protocol (Triton's "
                                                 "inference.GRPCInferenceService) on this port, e.g. 8001 as Triton; "
                                                 "off by default (needs the grpc extra)")
    p.add_argument("--metrics-port", type=int, help="also serve GET /metrics on this port, e.g. 8002 as Triton, "
                                                    "without the bearer token (the HTTP port's /metrics stays and "
                                                    "keeps it); off by default")
    p.add_argument("--backend", choices=["auto", "cupy", "numpy"],
                   help="auto (default): CuPy when it imports and a GPU is visible, else NumPy")
    p.add_argument("--device", type=int, help="GPU index (default 0)")
    p.add_argument("--fusion-dir", help="fusion repository: its *.json graphs are registered at start, and "
                                        "fusions registered over HTTP are kept there (Triton's model repository)")
    p.add_argument("--cache-dir", help="kernel cache directory (segfuse's cubins in kernels/, CuPy's cache in cupy/)")
    p.add_argument("--token", help="require 'Authorization: Bearer TOKEN' (health checks stay open); "
                                   "prefer SEGFUSE_TOKEN, which does not show in ps")
    size = _size
    p.add_argument("--max-body-bytes", type=size, help="request body limit (default 256M)")
    p.add_argument("--max-ops", type=int, help="ops per graph (default 4096)")
    p.add_argument("--max-rank", type=int, help="tensor rank (default 8)")
    p.add_argument("--max-buffer-bytes", type=size, help="bytes of one buffer (default 4G)")
    p.add_argument("--max-total-bytes", type=size, help="bytes of all buffers together (default 32G)")
    p.add_argument("--max-region-bytes", type=size, help="bytes of all shared-memory regions registered (default 64G)")
    p.add_argument("--max-regions", type=int, help="shared-memory regions registered before 413 (default 1024)")
    p.add_argument("--max-queued-runs", type=int, help="runs queued or running before 429 (default 256)")
    p.add_argument("--max-fusions", type=int, help="registered fusions before 413 (default 1024)")
    p.add_argument("--max-fusion-bytes", type=size, help="their graphs' JSON together before 413 (default 64M)")
    p.add_argument("--max-plan-work", type=int, help="work units validating one graph or planning one run may "
                                                     "take before 413 (default 1000000)")
    p.add_argument("--max-plan-seconds", type=float, help="seconds validating one graph or planning one run may "
                                                          "take before 413 (default 10)")
    p.add_argument("--max-run-bytes", type=size, help="memory one run may need (buffers, scratch, inline "
                                                      "outputs) before 413 (default 16G)")
    p.add_argument("--max-header-bytes", type=size, help="a request's line and headers together before 431 "
                                                          "(default 64K)")
    p.add_argument("--header-timeout", type=float, help="seconds to send a request's headers before 408 (default 10)")
    p.add_argument("--body-timeout", type=float, help="seconds without a byte of an unfinished body before 408 "
                                                      "(default 30)")
    p.add_argument("--keep-alive-timeout", type=float, help="seconds an idle keep-alive connection stays open "
                                                            "(default 5)")
    p.add_argument("--run-workers", type=int, help="threads running fusions, each on its own CUDA stream (default 1)")
    p.add_argument("--max-batch", type=int, help="runs a worker launches together, with one wait (default 32)")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"],
                   help="level of uvicorn's and segfuse's logs (default info)")
    p.add_argument("--processes", type=int, default=1, metavar="N",
                   help="run N server processes on ports PORT..PORT+N-1, each with its own buffers and fusions "
                        "(one GPU host serves more runs with several; cli/serve_group.py)")
    p.add_argument("--mps", action="store_true",
                   help="start NVIDIA's MPS control daemon for these processes and quit it after them, so their "
                        "kernels share the GPU instead of taking turns")
    p.add_argument("--route", action="store_true",
                   help="with --processes N: the processes are shards shard-0..N-1 on ports PORT+1..PORT+N, and a "
                        "router on PORT sends each request to the shard of its Segfuse-Namespace header "
                        "(HAProxy; docs/operations.md, \"Scaling out\")")
    p.add_argument("--router-busy-poll", action="store_true",
                   help="with --route: the router's one thread polls without sleeping: a core held whole for lower "
                        "latency per request (docs/operations.md)")
    p.add_argument("--shard-id", default=os.environ.get("SEGFUSE_SHARD_ID"),
                   help="serve as this shard of a routed group (every Segfuse-Namespace its own runtime; "
                        "SEGFUSE_SHARD_ID)")
    p.add_argument("--log-format", choices=["text", "json"],
                   help="text (default) or json: one JSON object per line (time, level, logger, message, "
                        "request_id)")
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction,
                   help="write one line per request as uvicorn does (client, request line, status); off by "
                        "default as in Triton, since it costs throughput")
    p.set_defaults(func=cmd_serve)


def _size(text: str) -> int:
    from segfuse.server.settings import parse_size

    try:
        return parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size like 1048576, 64M or 2G") from None


def settings_from_args(args):
    from segfuse.server.settings import Settings

    try:
        return Settings.from_env(**_overrides(args))
    except ValueError as e:
        raise UserError(str(e)) from None


def _overrides(args) -> dict:
    return {k: getattr(args, k, None) for k in (
        "host", "port", "grpc_port", "metrics_port", "backend", "device", "cache_dir", "fusion_dir", "token", "max_body_bytes", "max_ops", "max_rank",
        "max_buffer_bytes", "max_total_bytes", "max_region_bytes", "max_regions", "max_queued_runs", "max_fusions",
        "max_fusion_bytes", "max_plan_work", "max_plan_seconds", "max_run_bytes", "run_workers", "max_batch",
        "max_header_bytes", "header_timeout", "body_timeout",
        "keep_alive_timeout", "log_level", "log_format", "access_log")}


def cmd_serve(args) -> int:
    try:
        import uvicorn
        from segfuse.server import create_app
        from segfuse.server.array_backends import cupy_missing
        from segfuse.server.http_limits import server_options
        from segfuse.server.logs import log_config
    except ImportError as e:
        raise UserError(f"the server needs its extra dependencies: pip install 'segfuse[server]' ({e})") from None
    settings = settings_from_args(args)
    if args.processes < 1:
        raise UserError("--processes must be at least 1")
    if args.route and args.processes < 2:
        raise UserError("--route needs --processes 2 or more (one process needs no router)")
    if args.router_busy_poll and not args.route:
        raise UserError("--router-busy-poll is an option of the router: give --route")
    if settings.grpc_port is not None and (args.processes > 1 or args.mps or args.shard_id):
        raise UserError("--grpc-port (SEGFUSE_GRPC_PORT) serves one process: not with --processes, --mps or a shard")
    if settings.metrics_port is not None and (args.processes > 1 or args.mps or args.shard_id):
        raise UserError("--metrics-port (SEGFUSE_METRICS_PORT) serves one process: not with --processes, --mps or "
                        "a shard (scrape each process's /metrics on its HTTP port)")
    if args.processes > 1 or args.mps:  # each process checks the backend itself; the group holds no GPU
        from .serve_group import serve_group

        return serve_group(settings, args.processes, args.mps, args.route, args.router_busy_poll)
    missing = cupy_missing() if settings.backend == "cupy" else None
    if missing:  # a GPU deployment that forgot its GPU must not serve on the CPU unnoticed
        raise UserError(f"--backend cupy (SEGFUSE_BACKEND=cupy) needs a visible CUDA GPU: {missing}. In a container, "
                        "start it with a GPU (docker run --gpus all; on Kubernetes a nvidia.com/gpu limit); to serve on "
                        "the CPU on purpose, pass --backend numpy or set SEGFUSE_BACKEND=numpy")
    if args.shard_id:
        from segfuse.scaleout.shard import ShardApp

        app = ShardApp(args.shard_id, _overrides(args))
    else:
        app = create_app(settings)
        app.state.server_state.freeze_gc = True
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                access_log=settings.access_log, log_config=log_config(settings.log_level, settings.log_format),
                **server_options(settings))
    return 0
