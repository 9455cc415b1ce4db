"""Regenerate the generated parts of the graph-format docs from the code.

    python docs/gen_docs.py           # rewrite docs/fusion-1.schema.json and the generated
                                      # sections of docs/graph-format.md
    python docs/gen_docs.py --check   # exit 1 (and say what) if any of them is out of date

Generated from the code, never edited by hand:
- docs/fusion-1.schema.json: `segfuse.compiler.schema.json_schema()`;
- the op reference table in docs/graph-format.md (between the `op-table` markers), from the op
  registry: name, kind, operands, attributes with defaults, doc;
- the validation-errors example in docs/graph-format.md (between the `validation-errors`
  markers): `segfuse validate` run on a broken graph, its real output;
- the tables of ATen ops in docs/torch.md (between the `aten-ops` markers): what
  `segfuse.torch.capture` lowers (its `@lowers` table and the generic rule through the op
  registry) and what it refuses with an alternative. Needs torch (the torch or dev extra).
tests/test_docs_schema.py fails when any of them is stale.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import io
import json
import os
import sys
import tempfile
import types
import typing
from pathlib import Path

DOCS = Path(__file__).resolve().parent
SCHEMA_PATH = DOCS / "fusion-1.schema.json"
FORMAT_DOC = DOCS / "graph-format.md"
TORCH_DOC = DOCS / "torch.md"

KIND_ORDER = ["pointwise", "creation", "view", "movement", "reduction", "scan", "sort", "gather", "scatter"]


def schema_text() -> str:
    from segfuse.compiler.schema import json_schema

    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


# ---- the op table ---------------------------------------------------------------------------
def fmt_type(ann) -> str:
    """A pydantic field annotation the way the docs write it: `int | str`, `list[int]`, `dtype`."""
    from segfuse.compiler.dtypes import DType

    if ann is type(None):
        return "null"
    if ann is DType:
        return "dtype"
    if ann in (bool, int, float, str):
        return ann.__name__
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Annotated:  # (a number attribute's NaN and infinity strings)
        return fmt_type(args[0])
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if isinstance(ann, type) and issubclass(ann, enum.Enum):  # strings on the wire: the values
        return " \\| ".join(json.dumps(m.value) for m in ann)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(fmt_type(a) for a in args)
    if origin is list:
        return f"list[{fmt_type(args[0])}]"
    return getattr(ann, "__name__", str(ann))


def fmt_default(v) -> str:
    if hasattr(v, "value") and not isinstance(v, (bool, int, float)):  # enums (DType)
        v = v.value
    return json.dumps(v)


def attr_cell(op) -> str:
    parts = []
    for name, f in op.attrs.model_fields.items():
        t = fmt_type(f.annotation)
        if f.is_required():
            parts.append(f"`{name}`: {t} (required)")
        else:
            parts.append(f"`{name}`: {t} = `{fmt_default(f.default)}`")
    return "<br>".join(parts) if parts else "—"


def operand_cell(op) -> str:
    if op.variadic:
        return f"{op.operands[0]}… (1 or more tensors)"
    lo, _ = op.arity()
    cells = []
    for i, name in enumerate(op.operands):
        s = name
        if i in op.literal_ok:
            s += " (tensor or number)"
        if i >= lo:
            s += " (optional)"
        cells.append(s)
    return ", ".join(cells) if cells else "— (none)"


def results_cell(op) -> str:
    return "1" if op.n_outputs == 1 else f"{op.n_outputs} (`out` is a list)"


PROBE_DTYPES = ["bool", "int32", "float16"]


def pointwise_probe(op) -> str:
    """What a pointwise op does with bool, int32 and float16 tensors, found by asking its shape
    and dtype rule (so the table cannot disagree with validation)."""
    from segfuse.compiler.dtypes import DType
    from segfuse.compiler.errors import OpError
    from segfuse.compiler.ops.registry import InferCtx, TensorType

    if op.kind.value != "pointwise" or op.attrs.model_fields or op.variadic:
        return ""
    parts = []
    for dt in PROBE_DTYPES:
        operands = [TensorType(DType(dt), (2,)) for _ in op.operands]
        if op.name == "where":
            operands[0] = TensorType(DType.bool, (2,))
        try:
            (t,) = op.infer(InferCtx(), operands, op.attrs())
            parts.append(f"{dt} → {t.dtype}")
        except OpError:
            parts.append(f"{dt} ✗")
    return "; ".join(parts)


def doc_cell(op) -> str:
    doc = (op.doc or "").replace("|", "\\|").replace("\n", " ")
    probe = pointwise_probe(op)
    if probe:
        doc = (doc + " " if doc else f"elementwise `{op.name}` (PyTorch semantics). ") + f"<br>_{probe}_"
    return doc


def op_table() -> str:
    from segfuse.compiler.ops import REGISTRY

    ops = sorted(REGISTRY.values(), key=lambda o: (KIND_ORDER.index(o.kind.value) if o.kind.value in KIND_ORDER
                                                   else len(KIND_ORDER), o.name))
    lines = [f"{len(ops)} ops. Operands go in `inputs`, in this order; attributes are fields of the op "
             "object next to `op`, `out` and `inputs`. For pointwise ops the last line of the doc says what "
             "the op makes of two tensors of one dtype (bool, int32, float16; ✗: rejected); mixed dtypes "
             "and literals promote first (see [Literals and type promotion](#literals-and-type-promotion)).", "",
             "| op | kind | operands (`inputs`) | attributes | results | doc |",
             "| --- | --- | --- | --- | --- | --- |"]
    for op in ops:
        lines.append(f"| `{op.name}` | {op.kind.value} | {operand_cell(op)} | {attr_cell(op)} | "
                     f"{results_cell(op)} | {doc_cell(op)} |")
    return "\n".join(lines) + "\n"


# ---- the validation-errors example -----------------------------------------------------------
BROKEN_GRAPH = {
    "format": "segfuse.fusion/1",
    "name": "broken",
    "inputs": [
        {"name": "topk_ids", "dtype": "int64", "shape": ["T", 4]},
        {"name": "scale", "dtype": "float32", "shape": [3]},
    ],
    "ops": [
        {"op": "reshape", "out": "flat", "inputs": ["topk_ids"], "shape": [-1]},
        {"op": "ful", "out": "zeros", "inputs": [], "shape": [16], "value": 0},
        {"op": "scatter", "out": "counts", "inputs": ["flat", "flat", 1], "dim": 0, "reduce": "sum"},
        {"op": "mul", "out": "scaled", "inputs": ["scale", "topk_ids"]},
        {"op": "cumsum", "out": "offsets", "inputs": ["flat"], "dim": 1},
        {"op": "add", "out": "total", "inputs": ["flat", "later"]},
        {"op": "neg", "out": "later", "inputs": ["flat"]},
        {"op": "iota", "out": "positions", "inputs": [], "length": "T*E"},
    ],
    "outputs": ["counts", {"name": "later", "alias_of": "topk_ids"}, "missing"],
}


def _graph_text(d: dict) -> str:
    lines = ["{"]
    keys = list(d)
    for n, k in enumerate(keys):
        v, comma = d[k], ("," if n < len(keys) - 1 else "")
        if k in ("inputs", "ops"):
            lines.append(f'  "{k}": [')
            lines += [f"    {json.dumps(x)}" + ("," if i < len(v) - 1 else "") for i, x in enumerate(v)]
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v)}{comma}")
    return "\n".join(lines + ["}"])


def validation_errors() -> str:
    """`segfuse validate broken.json` run in-process: the graph, the command and its output."""
    from segfuse.cli import main

    graph = _graph_text(BROKEN_GRAPH)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "broken.json")
        with open(path, "w") as f:
            f.write(json.dumps(BROKEN_GRAPH))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["validate", path])
    text = (out.getvalue() + err.getvalue()).rstrip()
    # the file marker makes tests/test_docs_commands.py write the graph and run the session too
    return ("`broken.json`:\n\n<!-- file: broken.json -->\n```json\n" + graph + "\n```\n\n"
            "```console\n$ segfuse validate broken.json\n" + text + f"\n$ echo $?\n{rc}\n```\n")


# ---- the ATen ops segfuse.torch.capture lowers (docs/torch.md) ---------------------------------
def _functional_tensor_overload(op) -> bool:
    """An overload a torch.export graph can hold: functional, tensors out, no named dims (not an
    `out=` variant, nor TorchScript's overloads on numbers, lists and strings)."""
    schema = op._schema
    return (not schema.is_mutable and bool(schema.returns) and all(str(r.type) == "Tensor" for r in schema.returns)
            and not any("Dimname" in str(a.type) for a in schema.arguments))


def aten_op_rows() -> list[tuple[str, list[str], str]]:
    """(ATen op, its overloads, what lowers them) per op and way of lowering: a family module of
    segfuse.torch.capturing (its `@lowers` table), or the registry op of the same name (the
    generic rule)."""
    import torch
    from segfuse.compiler.ops import REGISTRY
    from segfuse.torch.capturing.lowering import lower_generic, lowering_of, registered_lowerings

    rows: dict[tuple[str, str], set[str]] = {}
    for key, fn in registered_lowerings().items():
        how = f"`capturing/{fn.__module__.rsplit('.', 1)[-1]}.py`"
        if isinstance(key, torch._ops.OpOverloadPacket):
            overloads = [getattr(key, n) for n in key.overloads()]
            overloads = [o for o in overloads if _functional_tensor_overload(o) and lowering_of(o) is fn]
        else:
            overloads = [key]
        for o in overloads:
            rows.setdefault((str(o.overloadpacket), how), set()).add(o._overloadname)
    for name, op in REGISTRY.items():
        packet = getattr(torch.ops.aten, name, None)
        for n in packet.overloads() if packet is not None else ():
            o = getattr(packet, n)
            if _functional_tensor_overload(o) and lowering_of(o) is lower_generic:
                rows.setdefault((str(packet), f"registry `{op.name}` (generic)"), set()).add(n)
    return [(name, sorted(ovs, key=lambda n: (n != "default", n)), how)
            for (name, how), ovs in sorted(rows.items())]


def aten_op_table() -> str:
    from segfuse.torch.capturing.lowering import alternatives

    rows = aten_op_rows()
    lines = [f"{len({r[0] for r in rows})} ATen ops ({sum(len(r[1]) for r in rows)} overloads). Lowered by a "
             "module of `segfuse.torch.capturing`, which maps the op in PyTorch's meaning, or by the generic "
             "rule: the registry op of the same name, whose arguments are PyTorch's (an overload with an "
             "argument the registry op lacks is not taken by the rule: torch decomposes it, or a module lowers "
             "it). Either way each node's result is checked against the "
             "dtype and shape PyTorch computes for it.", "",
             "| ATen op | overloads | lowered by |", "| --- | --- | --- |"]
    for name, overloads, how in rows:
        lines.append(f"| `{name}` | {', '.join(f'`{o}`' for o in overloads)} | {how} |")
    refused = sorted(alternatives().items())
    lines += ["", f"Refused, with the nearest supported way to write them ({len(refused)} ops; any other op "
              "not above is refused too, naming it):", "", "| ATen op | write instead |", "| --- | --- |"]
    for name, alternative in refused:
        cell = alternative.replace("|", "\\|")
        lines.append(f"| `aten.{name}` | {cell} |")
    return "\n".join(lines) + "\n"


# ---- markers ---------------------------------------------------------------------------------
SECTIONS = {"op-table": op_table, "validation-errors": validation_errors}
TORCH_SECTIONS = {"aten-ops": aten_op_table}


def begin(name: str) -> str:
    return f"<!-- BEGIN {name}: generated by docs/gen_docs.py, do not edit -->"


def end(name: str) -> str:
    return f"<!-- END {name} -->"


def render(doc: str, sections: dict | None = None, path: Path | None = None) -> str:
    """`doc` with every generated section replaced by a fresh one (`sections`: the format doc's,
    unless given)."""
    for name, fn in (SECTIONS if sections is None else sections).items():
        b, e = begin(name), end(name)
        i, j = doc.find(b), doc.find(e)
        if i < 0 or j < i:
            raise SystemExit(f"{path or FORMAT_DOC}: markers for '{name}' are missing ({b} ... {e})")
        doc = doc[:i + len(b)] + "\n" + fn() + doc[j:]
    return doc


def outputs() -> dict[Path, str]:
    return {SCHEMA_PATH: schema_text(), FORMAT_DOC: render(FORMAT_DOC.read_text()),
            TORCH_DOC: render(TORCH_DOC.read_text(), TORCH_SECTIONS, TORCH_DOC)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="regenerate docs/fusion-1.schema.json and the generated sections "
                                "of docs/graph-format.md and docs/torch.md")
    p.add_argument("--check", action="store_true", help="only check; exit 1 if anything is out of date")
    args = p.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        if not path.exists() or path.read_text() != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    rel = [os.path.relpath(p, DOCS.parent) for p in stale]
    if args.check:
        if stale:
            print("out of date (run python docs/gen_docs.py): " + ", ".join(rel), file=sys.stderr)
            return 1
        print("up to date")
        return 0
    print("rewrote " + ", ".join(rel) if rel else "already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
