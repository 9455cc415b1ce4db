"""`segfuse capture MODULE:FUNCTION --example ... [--dynamic ...] [-o graph.json]`: a PyTorch function
in a user's file becomes a graph file that the compiler loads and that computes what eager PyTorch
computes (the oracle: the same function run eagerly) at every size of a dynamic dim; mistakes on
the command line, code segfuse cannot express and a missing torch exit with status 2 and say what."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers.processes import segfuse
from helpers.waiting import scaled

torch = pytest.importorskip("torch")
from segfuse.cli import main  # noqa: E402
from segfuse.compiler import Engine, load_fusion  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

ROUTING = '''
import torch


def route(topk_ids, weights, experts=8):
    flat = topk_ids.flatten()
    counts = torch.zeros(experts, dtype=torch.int64).scatter_add_(0, flat, torch.ones_like(flat))
    return {"counts": counts, "offsets": torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0)),
            "order": torch.argsort(flat, stable=True), "probs": torch.softmax(weights, -1)}
'''

REFUSED = '''
import torch


def kth_values(x):
    y = x * 2
    return torch.kthvalue(y, 2, 0).values + 1


def branches(x):
    if x.sum() > 0:
        return x + 1
    return x - 1
'''


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _load(path, name: str):
    spec = importlib.util.spec_from_file_location(f"_cli_capture_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _line(path, text: str) -> int:
    return next(k for k, ln in enumerate(path.read_text().splitlines(), 1) if text in ln)


def _cli(*argv) -> tuple[int, str, str]:
    """`segfuse *argv` in this process: (status, stdout, stderr)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:  # argparse's own usage errors
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


# ---- a graph file that runs like eager torch ---------------------------------------------------------
def test_captured_file_runs_like_eager_torch_at_every_size_of_the_dynamic_dim(tmp_path):
    src = _write(tmp_path, "routing.py", ROUTING)
    # examples of one token, as a decode step has: the dim stays a symbol
    r = segfuse("capture", "routing.py:route", "--example", "topk_ids=1x2xlong", "--example", "weights=1x8xfloat32",
                "--dynamic", "topk_ids=0:T", "--dynamic", "weights=0:T", "-o", "graph.json", cwd=tmp_path)
    assert r.stdout.startswith("wrote graph.json: 'route' (") and "output probs: float32[T, 8]" in r.stdout
    graph = json.loads((tmp_path / "graph.json").read_text())
    assert [(i["name"], i["dtype"], i["shape"]) for i in graph["inputs"]] == \
        [("topk_ids", "int64", ["T", 2]), ("weights", "float32", ["T", 8])]
    fusion = load_fusion((tmp_path / "graph.json").read_text())
    route = _load(src, "route")
    engine = Engine.default("numpy")
    g = torch.Generator().manual_seed(5)
    for t in (3, 11):
        ids, weights = torch.randint(0, 8, (t, 2), generator=g), torch.randn(t, 8, generator=g)
        got = engine.run(fusion, {"topk_ids": ids.numpy(), "weights": weights.numpy()}).outputs
        want = route(ids, weights)
        assert list(got) == list(want)
        for k, w in want.items():
            torch.testing.assert_close(torch.from_numpy(np.asarray(got[k])), w,
                                       msg=lambda m, k=k, t=t: f"T={t} {k}: {m}")


def test_a_module_path_from_the_current_directory_prints_the_graph(tmp_path):
    pkg = tmp_path / "models"
    pkg.mkdir()
    _write(pkg, "routing.py", ROUTING + 'print("routing loaded")\n')
    r = segfuse("capture", "models.routing:route", "-e", "topk_ids=6x2xint64", "-e", "weights=6x8xfloat32",
                "--name", "route_static", cwd=tmp_path)
    graph = json.loads(r.stdout)  # only the graph on stdout: what the module prints goes to stderr
    assert "routing loaded" in r.stderr
    assert graph["name"] == "route_static" and graph["inputs"][0]["shape"] == [6, 2]
    ids, weights = torch.randint(0, 8, (6, 2)), torch.randn(6, 8)
    got = Engine.default("numpy").run(load_fusion(r.stdout), {"topk_ids": ids.numpy(), "weights": weights.numpy()})
    assert np.array_equal(got.outputs["counts"], torch.bincount(ids.flatten(), minlength=8).numpy())


def test_a_symbol_without_a_name_is_named_after_the_parameter_and_dim(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "unnamed_dim.py", "def double(x):\n    return x * 2\n")
    rc, out, err = _cli("capture", "unnamed_dim.py:double", "-e", "x=3x5xfloat16", "-d", "x=-1")
    assert rc == 0, err
    assert json.loads(out)["inputs"] == [{"name": "x", "dtype": "float16", "shape": [3, "x_1"]}]


# ---- what is refused ----------------------------------------------------------------------------------
def test_an_unsupported_op_exits_2_with_the_refusal_op_and_file_line(tmp_path):
    src = _write(tmp_path, "refused.py", REFUSED)
    r = segfuse("capture", "refused.py:kth_values", "--example", "x=4x3xfloat32", "-o", "g.json", cwd=tmp_path,
                check=2)
    assert "cannot capture refused.py:kth_values: aten.kthvalue.default: " in r.stderr
    assert f"(at refused.py:{_line(src, 'torch.kthvalue')})" in r.stderr and "instead: " in r.stderr
    assert r.stdout == "" and not (tmp_path / "g.json").exists()


def test_data_dependent_code_is_refused_saying_the_examples_are_random(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = _write(tmp_path, "refused_branch.py", REFUSED)
    rc, out, err = _cli("capture", "refused_branch.py:branches", "--example", "x=4xfloat32")
    assert rc == 2 and out == ""
    assert "data-dependent control flow" in err and f"(at refused_branch.py:{_line(src, 'if x.sum()')})" in err
    assert "example inputs are random" in err and "torch.where" in err


@pytest.mark.parametrize("example, says", [
    ("x=4x4", "no dtype; give one after the sizes, e.g. x=4x4xfloat32"),
    ("x=4x", "no dtype"),
    ("x=Tx4xfloat32", "sizes of an example are numbers, not 'T'; give a size, and make the dim dynamic with "
                      "--dynamic x=0:T"),
    ("x=4xcomplex64", "unknown dtype 'complex64' (dtypes: bool, uint8"),
    ("4xfloat32", "expects NAME=SHAPExDTYPE"),
    ("x=", "expects NAME=SHAPExDTYPE"),
    ("1x=4xint8", "'1x' is not a parameter name"),
    ("y=4xfloat32", "has no parameter 'y' (parameters: x, y2)"),
])
def test_a_bad_example_exits_2_naming_it(tmp_path, monkeypatch, example, says):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "examples_fn.py", "def f(x, y2=None):\n    return x + 1\n")
    rc, out, err = _cli("capture", "examples_fn.py:f", "--example", example)
    assert rc == 2 and out == ""
    assert err.startswith(f"error: --example {example}: ") and says in err, err


@pytest.mark.parametrize("argv, says", [
    (["-e", "x=4xint32", "-e", "x=5xint32"], "--example x=5xint32: x has an example already"),
    (["-e", "x=4xint32", "-d", "x=1"], "--dynamic x=1: x has 1 dim (4), no dim 1"),
    (["-e", "x=4xint32", "-d", "y=0"], "--dynamic y=0: 'y' has no --example"),
    (["-e", "x=4xint32", "-d", "x=zero"], "--dynamic x=zero: the dim 'zero' is not a number"),
    (["-e", "x=4xint32", "-d", "x=0:2T"], "--dynamic x=0:2T: the size symbol '2T' is not a name"),
    (["-e", "x=4xint32", "-d", "x"], "--dynamic x: expects NAME=DIM"),
    (["-e", "x=4xint32", "--name", "two words"], "--name two words: a graph name is"),
    ([], "give an example input for each tensor parameter"),
])
def test_bad_dynamic_dims_and_names_exit_2_naming_them(tmp_path, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "dyn_fn.py", "def f(x, y):\n    return x + y\n")
    rc, _, err = _cli("capture", "dyn_fn.py:f", *argv)
    assert rc == 2 and says in err, err


def test_a_parameter_without_an_example_exits_2_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "two_params.py", "def f(a, b, scale=2.0):\n    return a * scale + b\n")
    rc, _, err = _cli("capture", "two_params.py:f", "-e", "b=3xfloat32")
    assert rc == 2 and "parameter 'a' has no --example (give one: --example a=SHAPExDTYPE)" in err
    # a parameter with a default is a constant of the trace
    rc, out, err = _cli("capture", "two_params.py:f", "-e", "a=3xfloat32", "-e", "b=3xfloat32")
    assert rc == 0, err
    a, b = torch.randn(3), torch.randn(3)
    got = Engine.default("numpy").run(load_fusion(out), {"a": a.numpy(), "b": b.numpy()}).outputs["output_0"]
    torch.testing.assert_close(torch.from_numpy(got), a * 2.0 + b)


@pytest.mark.parametrize("target, says", [
    ("missing.py:f", "missing.py: no such file"),
    ("targets.py:nope", "targets.py:nope: targets.py has no attribute 'nope'"),
    ("targets.py:LIMIT", "targets.py:LIMIT: LIMIT is int, not a function"),
    ("targets.py", "expects MODULE:FUNCTION or path/to/file.py:FUNCTION"),
    ("no_such_module:f", "no module named 'no_such_module'"),
    ("broken.py:f", "importing broken.py failed: ZeroDivisionError: division by zero (at broken.py:2)"),
])
def test_a_target_that_does_not_import_exits_2_saying_why(tmp_path, monkeypatch, target, says):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "targets.py", "LIMIT = 3\n\n\ndef f(x):\n    return x\n")
    _write(tmp_path, "broken.py", "import torch\nRATE = 1 / 0\n")
    rc, _, err = _cli("capture", target, "-e", "x=4xfloat32")
    assert rc == 2 and says in err, err


def test_without_torch_the_command_says_to_install_the_torch_extra(tmp_path):
    _write(tmp_path, "plain.py", "def f(x):\n    return x\n")
    code = "import sys; sys.modules['torch'] = None; from segfuse.cli import main; sys.exit(main())"
    r = subprocess.run([sys.executable, "-c", code, "capture", "plain.py:f", "-e", "x=4xfloat32"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=scaled(120))
    assert r.returncode == 2 and "needs PyTorch" in r.stderr and ".[torch]" in r.stderr
    assert "Traceback" not in r.stderr


def test_help_shows_the_forms_and_examples():
    out = segfuse("capture", "--help").stdout
    assert "NAME=SHAPExDTYPE" in out and "NAME=DIM[:SYMBOL]" in out and "examples:" in out
    assert "capture" in segfuse("--help").stdout
