"""`segfuse explain`: print the segmenter's plan for a graph at given sizes."""

from __future__ import annotations

import argparse
import sys

from .common import UserError, load_graph


def add_parsers(sub) -> None:
    p = sub.add_parser("explain", help="show how a graph is cut into kernels at given sizes",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  segfuse explain examples/moe_argsort.json --shape T=4096\n"
                              "  segfuse explain examples/moe_problem_sizes.json --shape T=32,K=4 --json")
    p.add_argument("graph", help="graph JSON file")
    p.add_argument("--shape", "-s", action="append", default=[], metavar="SYM=N[,SYM=N]",
                   help="values of the graph's size symbols (repeatable); an input's full shape may be "
                        "given as NAME=4096x8")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--compile", metavar="ARCH", nargs="?", const="sm_90", default=None,
                   help="also compile every kernel with NVRTC for ARCH (default sm_90), no GPU needed "
                        "(the nvrtc extra)")
    p.set_defaults(func=cmd_explain)


def parse_shapes(items: list[str], fusion) -> dict[str, tuple]:
    """Input shapes from symbol values (T=4096) or whole input shapes (topk_ids=4096x8)."""
    from segfuse.compiler.shapes import evaluate
    env: dict[str, int] = {}
    given: dict[str, tuple] = {}
    for item in ",".join(items).split(","):
        if not item.strip():
            continue
        name, sep, value = item.strip().partition("=")
        if not sep:
            raise UserError(f"--shape expects SYM=N, got '{item}'")
        try:
            dims = tuple(int(v) for v in value.lower().split("x")) if value else ()
        except ValueError:
            raise UserError(f"--shape {name}: '{value}' is not a size (N, or NxM for an input's shape)") from None
        if name in fusion.input_names:
            given[name] = dims
        elif name in fusion.symbols and len(dims) == 1:
            env[name] = dims[0]
        else:
            raise UserError(f"--shape {name}: not a size symbol or input of the graph (symbols: "
                            f"{', '.join(sorted(fusion.symbols)) or 'none'}; inputs: {', '.join(fusion.input_names)})")
    shapes = {}
    for name, t in fusion.inputs:
        if name in given:
            shapes[name] = given[name]
            continue
        missing = sorted(str(s) for d in t.shape if not isinstance(d, int) for s in d.free_symbols
                         if str(s) not in env)
        if missing:
            raise UserError(f"give a value for {', '.join(missing)} (e.g. --shape {missing[0]}=4096)")
        shapes[name] = tuple(evaluate(d, env) for d in t.shape)
    return shapes


def cmd_explain(args) -> int:
    from segfuse.compiler.engine import Engine

    f = load_graph(args.graph)
    shapes = parse_shapes(args.shape, f)
    plan = Engine.default("numpy").plan(f, shapes)
    if args.json:
        print(plan.to_json())
    else:
        print_plan(plan, f, {str(k): int(v) for k, v in f.bind(shapes).env.items()})
    if args.compile:
        _compile(f, shapes, args.compile, sys.stderr if args.json else sys.stdout)  # keep --json's stdout JSON
    return 0


def _compile(fusion, shapes: dict, arch: str, out) -> None:
    from segfuse.compiler.engine import Engine

    try:
        compiler, modules = Engine.default("numpy").compile_offline(fusion, shapes, arch)
    except RuntimeError as e:  # no NVRTC, or CompileError with NVRTC's log naming the line
        raise UserError(f"--compile {arch}: {e}") from None
    print(f"compiled {len(modules)} kernel module(s) for {arch} with {compiler}: "
          f"{sum(n for _, _, n in modules)} bytes of cubin", file=out)


def print_plan(plan, fusion, env: dict[str, int] | None = None) -> None:
    """Readable at 80 columns; the shared-memory limit cited is the visible GPU's, else the
    documented target's (explain_text.device_smem)."""
    from segfuse.compiler.segmenter.capability import DEFAULT_CAPABILITY

    from .explain_text import device_smem, plan_lines

    print("\n".join(plan_lines(plan, fusion, env or {}, device_smem(), DEFAULT_CAPABILITY.smem_budget_bytes)))
