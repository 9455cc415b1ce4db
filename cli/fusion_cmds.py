"""`segfuse fusions ls|get|rm`: the fusions a segfuse server has registered (through the client's
`fusions`, `fusion` and `unregister`)."""

from __future__ import annotations

import json
import os

from .client_cmds import _RAW, DEFAULT_SERVER, _client, _guard, add_server_options, print_listing


def add_parsers(sub) -> None:
    p = sub.add_parser("fusions", help="list, show and remove the fusions registered on a server",
                       formatter_class=_RAW, description="Manage the fusions (registered graphs) a segfuse "
                                                         "server holds. Register one with `segfuse run GRAPH "
                                                         "--server URL` or POST /v2/fusions.",
                       epilog="examples:\n"
                              "  segfuse fusions ls --server 127.0.0.1:8000\n"
                              "  segfuse fusions get moe_problem_sizes\n"
                              "  segfuse fusions rm moe_problem_sizes")
    fsub = p.add_subparsers(dest="fusions_command", metavar="ACTION")
    fsub.required = True
    server = os.environ.get("SEGFUSE_SERVER", DEFAULT_SERVER)
    q = fsub.add_parser("ls", help="list fusions", formatter_class=_RAW,
                        epilog="example:\n  segfuse fusions ls --json")
    q.add_argument("--json", action="store_true", help="print the server's JSON")
    add_server_options(q, server)
    q.set_defaults(func=cmd_fusions_ls)
    q = fsub.add_parser("get", help="print a fusion and its canonical graph (JSON)", formatter_class=_RAW,
                        epilog="example:\n  segfuse fusions get moe_problem_sizes")
    q.add_argument("fusion", metavar="NAME_OR_ID", help="fusion name or id")
    add_server_options(q, server)
    q.set_defaults(func=cmd_fusions_get)
    q = fsub.add_parser("rm", help="unregister fusions (runs in progress finish)", formatter_class=_RAW,
                        epilog="example:\n  segfuse fusions rm moe_problem_sizes")
    q.add_argument("fusions", nargs="+", metavar="NAME_OR_ID", help="fusion names or ids")
    add_server_options(q, server)
    q.set_defaults(func=cmd_fusions_rm)


def _dims(shape) -> str:
    return "[" + ", ".join("?" if d == -1 else str(d) for d in shape) + "]"


def _line(f: dict, width: int) -> str:
    ins = ", ".join(f"{i['name']}: {i['datatype']}{_dims(i['shape'])}" for i in f.get("inputs", []))
    outs = ", ".join(o["name"] for o in f.get("outputs", []))
    return f"{f['name']:<{width}}  {f['id']}  {f.get('ops', '?'):>4} ops  {ins} -> {outs}"


@_guard
def cmd_fusions_ls(args) -> int:
    with _client(args) as c:
        fusions = c.fusions()
    return print_listing(fusions, args.json, "fusions", _line)


@_guard
def cmd_fusions_get(args) -> int:
    with _client(args) as c:
        print(json.dumps(c.fusion(args.fusion), indent=2))
    return 0


@_guard
def cmd_fusions_rm(args) -> int:
    with _client(args) as c:
        for ref in args.fusions:
            c.unregister(ref)
            print(f"unregistered {ref}")
    return 0
