"""docs/graph-format.md and docs/fusion-1.schema.json stay true to the code.

- the committed JSON Schema equals `json_schema()` and the generated sections of the format doc
  (op table, validation-errors example) equal what docs/gen_docs.py makes now;
- the schema is a valid JSON Schema that accepts every examples/*.json (which Fusion.from_json
  also accepts) and rejects structurally broken graphs that validation rejects too;
- the doc's tables name every op and every dtype, and its Python blocks run.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from helpers.waiting import scaled
from segfuse.compiler import Fusion, GraphError
from segfuse.compiler.dtypes import KSERVE_NAMES, DType
from segfuse.compiler.ops import REGISTRY
from segfuse.compiler.schema import json_schema

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXAMPLES = sorted((ROOT / "examples").glob("*.json"))
STALE = "out of date: run `python docs/gen_docs.py` and commit the result"


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", DOCS / "gen_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


G = _gen_docs()


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads((DOCS / "fusion-1.schema.json").read_text())


@pytest.fixture(scope="module")
def validator(schema):
    return jsonschema.Draft202012Validator(schema)


# ---- up to date ---------------------------------------------------------------------------------
def test_committed_schema_is_up_to_date(schema):
    assert schema == json_schema(), f"docs/fusion-1.schema.json is {STALE}"
    assert (DOCS / "fusion-1.schema.json").read_text() == G.schema_text(), f"docs/fusion-1.schema.json is {STALE}"


@pytest.mark.parametrize("section", sorted(G.SECTIONS))
def test_generated_section_is_up_to_date(section):
    doc = (DOCS / "graph-format.md").read_text()
    b, e = G.begin(section), G.end(section)
    assert doc.count(b) == 1 and doc.count(e) == 1
    committed = doc[doc.index(b) + len(b):doc.index(e)]
    assert committed == "\n" + G.SECTIONS[section](), f"section '{section}' of docs/graph-format.md is {STALE}"


def test_gen_docs_check_detects_and_fixes_stale_files(tmp_path, monkeypatch):
    schema_copy, doc_copy = tmp_path / "s.json", tmp_path / "f.md"
    schema_copy.write_text(G.schema_text().replace('"scatter"', '"scatterz"', 1))
    doc = (DOCS / "graph-format.md").read_text()
    doc_copy.write_text(doc.replace("| `scatter` | scatter |", "| `scatter` | pointwise |"))
    monkeypatch.setattr(G, "SCHEMA_PATH", schema_copy)
    monkeypatch.setattr(G, "FORMAT_DOC", doc_copy)
    assert G.main(["--check"]) == 1
    assert G.main([]) == 0
    assert G.main(["--check"]) == 0
    assert json.loads(schema_copy.read_text()) == json_schema()
    assert doc_copy.read_text() == doc


def test_gen_docs_check_cli_passes_on_the_repo():
    r = subprocess.run([sys.executable, str(DOCS / "gen_docs.py"), "--check"], capture_output=True, text=True,
                       cwd=ROOT, timeout=scaled(120))
    assert r.returncode == 0, r.stderr


# ---- the op table and the dtype table -------------------------------------------------------------
def table_rows(doc: str, header_start: str) -> list[list[str]]:
    lines = doc.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith(header_start))
    rows = []
    for ln in lines[i + 2:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]])
    return rows


def test_op_table_has_every_op_with_its_kind_and_attributes():
    rows = table_rows((DOCS / "graph-format.md").read_text(), "| op | kind |")
    by_name = {r[0].strip("`"): r for r in rows}
    assert set(by_name) == set(REGISTRY)
    for name, op in REGISTRY.items():
        r = by_name[name]
        assert r[1] == op.kind.value, name
        for attr, f in op.attrs.model_fields.items():
            assert f"`{attr}`" in r[3], (name, attr)
            if f.is_required():
                assert f"`{attr}`: " in r[3] and "(required)" in r[3]
    # spot checks against PyTorch's defaults
    assert '`reduce`: "none" \\| "add" \\| "mul" \\| "amax" \\| "amin" \\| "mean" = `"none"`' in by_name["scatter"][3]
    assert "`include_self`: bool = `true`" in by_name["scatter"][3]
    assert by_name["topk"][4].startswith("2")
    assert "src (tensor or number)" in by_name["scatter"][2]


def test_dtype_table_has_every_dtype():
    rows = table_rows((DOCS / "graph-format.md").read_text(), "| dtype | NumPy |")
    got = {r[0].strip("`"): r for r in rows}
    assert set(got) == {d.value for d in DType}
    for d in DType:
        assert got[d.value][3] == f"`{KSERVE_NAMES[d]}`"
        assert got[d.value][5] == str(d.itemsize)


def test_format_doc_python_blocks_run(tmp_path):
    doc = (DOCS / "graph-format.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert len(blocks) >= 2
    for code in blocks:
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=scaled(120))
        assert r.returncode == 0, code + r.stderr
    # the comment in the GraphError block shows what it really prints
    graph_error = next(b for b in blocks if "GraphError" in b)
    assert "ops[1].dim: dim 2 is out of range for a tensor of rank 1 (expected -1 to 0)" in subprocess.run(
        [sys.executable, "-c", graph_error], cwd=ROOT, capture_output=True, text=True, timeout=scaled(120)).stdout


def test_format_doc_text_blocks_show_real_output():
    # the `segfuse validate` transcripts pasted in the doc are what the CLI prints today
    doc = (DOCS / "graph-format.md").read_text()
    for m in re.finditer(r"```text\n\$ segfuse validate (examples/\S+\.json)\n(.*?)```", doc, flags=re.S):
        r = subprocess.run([sys.executable, "-c", "import sys; from segfuse.cli import main; "
                            "sys.exit(main())", "validate", m.group(1)], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0
        assert r.stdout == m.group(2), m.group(1)


def test_format_doc_first_graph_is_the_example_file():
    doc = (DOCS / "graph-format.md").read_text()
    first = re.search(r"## A first graph.*?```json\n(.*?)```", doc, flags=re.S).group(1)
    assert json.loads(first) == json.loads((ROOT / "examples" / "moe_problem_sizes.json").read_text())


# ---- the schema accepts the examples and rejects broken graphs -------------------------------------
def test_schema_is_a_valid_json_schema(schema):
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$id"].endswith("fusion-1.json")
    assert set(schema["$defs"]) >= {f"Op_{n}" for n in REGISTRY}


def test_there_are_examples():
    assert len(EXAMPLES) >= 7


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_validates_against_schema_and_validator(path, validator):
    d = json.loads(path.read_text())
    errors = sorted(validator.iter_errors(d), key=str)
    assert not errors, [e.message for e in errors]
    f = Fusion.from_json(d)
    assert f.name == d["name"] == path.stem


def _broken(mutate):
    d = json.loads((ROOT / "examples" / "moe_problem_sizes.json").read_text())
    mutate(d)
    return d


BROKEN = {
    "unknown op": lambda d: d["ops"][0].update(op="reshapes"),
    "unknown attribute": lambda d: d["ops"][3].update(axis=0),
    "missing required attribute": lambda d: d["ops"][3].pop("dim"),
    "attribute of the wrong type": lambda d: d["ops"][3].update(dim="0"),
    "reduce not in the enum": lambda d: d["ops"][3].update(reduce="sum"),
    "bad dtype": lambda d: d["inputs"][0].update(dtype="int"),
    "bad tensor name": lambda d: d["ops"][0].update(out="0flat"),
    "unknown top-level field": lambda d: d.update(version=1),
    "wrong format": lambda d: d.update(format="segfuse.fusion/2"),
    "ops missing": lambda d: d.pop("ops"),
    "output object with an unknown field": lambda d: d.update(outputs=[{"name": "counts", "inplace": "x"}]),
    "op without out": lambda d: d["ops"][1].pop("out"),
    "literal of the wrong JSON type": lambda d: d["ops"][1].update(value="0"),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_schema_and_validator_both_reject(what, validator):
    d = _broken(BROKEN[what])
    assert list(validator.iter_errors(d)), f"the schema accepts a graph with {what}"
    with pytest.raises(GraphError):
        Fusion.from_json(d)


def test_schema_accepts_what_only_validation_rejects(validator):
    # structure is fine, meaning is not: the schema passes it, validation does not
    d = _broken(lambda d: d["ops"][3].update(inputs=["t1", "nope", "t2"]))
    assert not list(validator.iter_errors(d))
    with pytest.raises(GraphError, match="unknown tensor 'nope'"):
        Fusion.from_json(d)


def test_every_op_has_a_schema_variant_that_accepts_a_minimal_op(validator):
    # one op object per registry entry, with its required attributes, passes the schema
    samples = {int: 0, str: "T", bool: True, float: 0.5}
    for name, op in REGISTRY.items():
        entry = {"op": name, "out": "y" if op.n_outputs == 1 else [f"y{k}" for k in range(op.n_outputs)],
                 "inputs": ["x"] * max(1, len(op.operands))}
        for attr, f in op.attrs.model_fields.items():
            if f.is_required():
                entry[attr] = _sample(f.annotation, samples)
        g = {"format": "segfuse.fusion/1", "inputs": [{"name": "x", "dtype": "float32", "shape": [2]}],
             "ops": [entry], "outputs": ["y" if op.n_outputs == 1 else "y0"]}
        errs = [e.message for e in validator.iter_errors(g)]
        assert not errs, (name, errs)
        bad = copy.deepcopy(g)
        bad["ops"][0]["not_an_attribute"] = 1
        assert list(validator.iter_errors(bad)), name


def _sample(ann, samples):
    import typing

    if ann in samples:
        return samples[ann]
    if ann is DType:
        return "float32"
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is list:
        return [_sample(args[0], samples)]
    if origin is typing.Literal:
        return args[0]
    if args:
        return _sample(args[0], samples)
    raise AssertionError(ann)
