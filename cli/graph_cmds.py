"""`segfuse validate` and `segfuse run` (in-process)."""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from . import client_cmds
from .common import UserError, load_graph, parse_pairs


def add_parsers(sub) -> None:
    p = sub.add_parser("validate", help="check a graph file and print its tensors",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  segfuse validate examples/moe_problem_sizes.json")
    p.add_argument("graph", help="graph JSON file")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("run", help="run a graph on .npy inputs (in-process, or on a server)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  segfuse run examples/moe_problem_sizes.json "
                              "--input topk_ids=ids.npy --output counts=counts.npy\n"
                              "  segfuse run examples/moe_problem_sizes.json -i topk_ids=buffer:ids_0 "
                              "-o counts=buffer:counts_0 --server 127.0.0.1:8000")
    p.add_argument("graph", help="graph JSON file")
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array (repeatable)")
    p.add_argument("--output", "-o", action="append", default=[], metavar="NAME=FILE.npy",
                   help="write an output to a .npy file (repeatable); outputs not named are printed")
    p.add_argument("--backend", default="numpy", choices=["numpy", "cupy"],
                   help="numpy (default), or cupy where CuPy sees a GPU")
    # --server URL (default $SEGFUSE_SERVER): run on a segfuse server instead
    client_cmds.add_server_options(p, os.environ.get("SEGFUSE_SERVER") or None, in_process=True)
    p.add_argument("--local", action="store_true", help="run in-process even where $SEGFUSE_SERVER is set")
    p.add_argument("--replace", action="store_true",
                   help="with a server: register the graph file first, replacing a different graph of the "
                        "same name (the server refuses that with 409 otherwise)")
    p.set_defaults(func=cmd_run)


def cmd_validate(args) -> int:
    f = load_graph(args.graph)
    if args.json:
        print(json.dumps({"id": f.id, "name": f.name,
                          "tensors": {k: {"dtype": str(t.dtype), "shape": [str(d) if not isinstance(d, int) else d
                                                                          for d in t.shape]}
                                      for k, t in f.types.items()}}, indent=2))
        return 0
    print(f"ok: '{f.name}' ({len(f.nodes)} ops, id {f.id})")
    print_signature(f)
    return 0


def print_signature(f) -> None:
    """A graph's inputs and outputs, a line each (validate's and capture's summary)."""
    for name, t in f.inputs:
        print(f"  input  {name}: {t}")
    for o in f.outputs:
        extra = f" (updates '{o.alias_of}' in place)" if o.alias_of else ""
        print(f"  output {o.name}: {f.types[o.name]}{extra}")


def cmd_run(args) -> int:
    from segfuse.compiler.engine import Engine
    if args.server and not args.local:
        return client_cmds.run_remote(args)
    for name, src in {**parse_pairs(args.input, "input"), **parse_pairs(args.output, "output")}.items():
        if src.startswith(client_cmds.BUFFER_PREFIX):
            raise UserError(f"'{name}={src}' names a server buffer: give --server URL (or set $SEGFUSE_SERVER) "
                            "to run on a segfuse server; in-process runs read and write .npy files")
    if args.replace:
        raise UserError("--replace replaces a graph registered on a server: give --server URL (or set "
                        "$SEGFUSE_SERVER)")

    f = load_graph(args.graph)
    inputs = {}
    for name, path in parse_pairs(args.input, "input").items():
        try:
            inputs[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise UserError(f"cannot load input '{name}' from {path}: {e}") from None
    outs = parse_pairs(args.output, "output")
    for name in outs:
        if name not in {o.name for o in f.outputs}:
            raise UserError(f"--output {name}: the graph has no output '{name}' "
                            f"(outputs: {', '.join(o.name for o in f.outputs)})")
    try:
        engine = Engine.default(args.backend)
    except ValueError as e:
        raise UserError(str(e)) from None
    res = engine.run(f, inputs)
    for name, arr in res.outputs.items():
        arr = arr.get() if hasattr(arr, "get") and not isinstance(arr, np.ndarray) else np.asarray(arr)  # CuPy
        if name in outs:
            np.save(outs[name], arr)
            print(f"{name}: {arr.dtype}{list(arr.shape)} -> {outs[name]}")
        else:
            with np.printoptions(threshold=64, edgeitems=4):
                print(f"{name}: {arr.dtype}{list(arr.shape)}\n{arr}")
    for name, path in parse_pairs(args.input, "input").items():
        if any(o.alias_of == name for o in f.outputs):
            np.save(path, inputs[name])
            print(f"{name}: updated in place -> {path}")
    sys.stdout.flush()
    return 0
