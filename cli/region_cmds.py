"""`segfuse regions ls|rm`: the shared-memory regions (system and CUDA) a server has registered."""

from __future__ import annotations

import os

from .client_cmds import _RAW, DEFAULT_SERVER, _client, _guard, add_server_options, print_listing
from .common import UserError


def add_parsers(sub) -> None:
    p = sub.add_parser("regions", help="list and unregister shared-memory regions on a server",
                       formatter_class=_RAW,
                       description="The system and CUDA shared-memory regions (Triton's extensions) a segfuse "
                                   "server has registered. Unregistering leaves the memory itself to its owner.",
                       epilog="examples:\n"
                              "  segfuse regions ls --server 127.0.0.1:8000\n"
                              "  segfuse regions rm ids_shm counts_shm\n"
                              "  segfuse regions rm --all")
    rsub = p.add_subparsers(dest="regions_command", metavar="ACTION")
    rsub.required = True
    q = rsub.add_parser("ls", help="list regions", formatter_class=_RAW, epilog="example:\n  segfuse regions ls --json")
    q.add_argument("--json", action="store_true", help="print the server's JSON")
    add_server_options(q, os.environ.get("SEGFUSE_SERVER", DEFAULT_SERVER))
    q.set_defaults(func=cmd_regions_ls)
    q = rsub.add_parser("rm", help="unregister regions", formatter_class=_RAW,
                        epilog="examples:\n  segfuse regions rm ids_shm\n  segfuse regions rm --all")
    q.add_argument("names", nargs="*", metavar="NAME", help="region names")
    q.add_argument("--all", action="store_true", help="every idle region, system and CUDA")
    add_server_options(q, os.environ.get("SEGFUSE_SERVER", DEFAULT_SERVER))
    q.set_defaults(func=cmd_regions_rm)


@_guard
def cmd_regions_ls(args) -> int:
    with _client(args) as c:
        regions = c.regions()
    return print_listing(regions, args.json, "regions", _region_line)


def _region_line(r: dict, width: int) -> str:
    where = f"key {r['key']} offset {r['offset']}" if r["kind"] == "system" else f"GPU {r['device_id']}"
    return f"{r['name']:<{width}}  {r['kind']:<6} {r['byte_size']:>12} B  {where}  in use by {r['ref_count']}"


@_guard
def cmd_regions_rm(args) -> int:
    if bool(args.names) == args.all:
        raise UserError("give region names or --all (not both)")
    with _client(args) as c:
        if args.all:
            for name in c.unregister_system_shared_memory() + c.unregister_cuda_shared_memory():
                print(f"unregistered {name}")
            return 0
        kinds = {r["name"]: r["kind"] for r in c.regions()}
        for name in args.names:
            if kinds.get(name) == "cuda":
                c.unregister_cuda_shared_memory(name)
            else:  # system, or unknown: the server's 404 names it
                c.unregister_system_shared_memory(name)
            print(f"unregistered {name}")
    return 0
