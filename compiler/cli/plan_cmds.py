"""`segfuse explain`: print the segmenter's plan for a graph at given sizes."""

from __future__ import annotations

import argparse

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
    p.set_defaults(func=cmd_explain)


def parse_shapes(items: list[str], fusion) -> dict[str, tuple]:
    """Input shapes from symbol values (T=4096) or whole input shapes (topk_ids=4096x8)."""
    from ..shapes import evaluate
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
    from ..engine import Engine

    f = load_graph(args.graph)
    plan = Engine.default("numpy").plan(f, parse_shapes(args.shape, f))
    if args.json:
        print(plan.to_json())
        return 0
    print_plan(plan, f)
    return 0


def _ops_text(plan, seg, fusion) -> str:
    parts = [f"{fusion.nodes[p].op.name}→{fusion.nodes[p].outputs[0]}" for p in seg.nodes]
    parts[:0] = []
    for c in sorted(seg.copies, key=lambda c: -c.at):
        parts.insert(c.at, f"copy {c.src}→{c.dst}")
    return ", ".join(parts)


def print_plan(plan, fusion) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table(title=f"{fusion.name}: {len(plan.segments)} segments, {plan.kernel_count} launches "
                        f"(shape class {plan.shape_class})", show_lines=True)
    for col in ("#", "kind", "ops", "reads → writes", "launch", "reason"):
        table.add_column(col, overflow="fold")
    for seg in plan.segments:
        h = seg.hints
        if not h.get("launch", True):
            launch = "none (view)"
        elif "routine" in h:
            launch = h["routine"]
        elif h.get("single_block"):
            launch = f"1 block × {h['threads']} threads, smem {h['smem_bytes']} B"
        else:
            blocks = h.get("blocks")
            launch = f"{blocks} block{'' if blocks == 1 else 's'} × {h.get('threads')} threads"
        io = f"{', '.join(seg.inputs) or '-'} → {', '.join(seg.outputs) or '-'}"
        reason = seg.reason
        for a in seg.aliases:
            reason += f"\n[{a.mode}] {a.tensor} → buffer of {a.buffer}: {a.why}"
        table.add_row(str(seg.id), seg.kind.value, escape(_ops_text(plan, seg, fusion)), escape(io),
                      escape(launch), escape(reason))
    console.print(table)
    bufs = ", ".join(f"#{b.id} {b.kind} {b.nbytes} B [{' '.join(b.tensors)}]" for b in plan.buffers)
    console.print(escape(f"buffers: {bufs}"), soft_wrap=True)
    if plan.views:
        console.print(escape("views (no data moves): " + ", ".join(f"{t}→{b}" for t, b in plan.views.items())))
    for c in plan.heuristics.get("checks", []):
        console.print(escape(f"size test: {c['what']}: {c['test']} → {c['holds']}"), soft_wrap=True)
