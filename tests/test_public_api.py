"""The public surface a refactor must keep (issue 14): `__all__` of `segfuse.compiler`,
`segfuse.client` and `segfuse.server`, and every import path that README.md, docs/, examples/ and
benchmarks/ use (`from segfuse... import ...`, `import segfuse... as x` with the `x.name` it uses,
and backticked `segfuse.<package>.<name>` references in Markdown).

Three checks: each pinned path imports and names something that exists; each path the files use
imports; and the files use no path outside PINNED_PATHS (a new one in the docs: add it below, so a
change of the public surface shows in review). Moving a pinned name: keep a re-export at the old path,
or change the docs and this list in the same commit.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

COMPILER_ALL = [
    "BindError", "CodegenOptions", "DataType", "DType", "Engine", "Fusion", "FusionDefinition", "GraphError", "Issue", "Limits",
    "RunError", "RunResult", "SegfuseError", "Tensor", "load_fusion", "run_graph",
]
CLIENT_ALL = ["AsyncClient", "Buffer", "Client", "ClientError", "FusionRef", "Region", "RunResult", "SystemRegion"]
SERVER_ALL = ["__version__", "create_app"]
SCALEOUT_ALL = ["DEFAULT_NAMESPACE", "NAMESPACE_HEADER", "NamespaceError", "parse_namespace", "shard_for"]
TORCH_ALL = ["TorchFusion", "capture", "check", "fusion"]

# "module:name" (name empty for a module imported whole), as found in the files today.
PINNED_PATHS = sorted("""
segfuse.client:AsyncClient segfuse.client:Buffer segfuse.client:Client segfuse.client:Region
segfuse.client:RunResult segfuse.client:ClientError segfuse.client:SystemRegion
segfuse.compiler:Fusion segfuse.compiler:FusionDefinition segfuse.compiler:GraphError segfuse.compiler:DataType
segfuse.compiler.builder:FusionDefinition
segfuse.cli:main segfuse.cli.client_cmds:plot_bench
segfuse.compiler.codegen:segment
segfuse.compiler.codegen:row_reduction segfuse.compiler.segmenter:pipeline segfuse.compiler:limits
segfuse.compiler.codegen.segment:VEC_BLOCKS_PER_SM segfuse.compiler.codegen.segment:generate
segfuse.compiler.cuda.runtime:CupyRuntime segfuse.compiler.cuda.runtime:get_runtime segfuse.compiler.cuda:graphs
segfuse.compiler.cuda.arrays:signature segfuse.compiler.cuda.prepare:modules_without_device
segfuse.compiler.segmenter.reference:simple_plan segfuse.compiler.segmenter.cache:PlanCache
segfuse.compiler.segmenter.capability:DEFAULT_CAPABILITY
segfuse.compiler.dtypes:DType segfuse.compiler.engine:Engine segfuse.compiler.errors:OpError
segfuse.compiler.ir:Fusion segfuse.compiler.ops:REGISTRY segfuse.compiler.ops.registry:InferCtx
segfuse.compiler.ops.registry:TensorType segfuse.compiler.plan:Segment segfuse.compiler.plan:SegmentKind
segfuse.compiler.schema:json_schema
segfuse.scaleout:shard_for segfuse.scaleout.router:haproxy_config
segfuse.torch: segfuse.torch:capture segfuse.torch:check segfuse.torch:fusion
segfuse.torch.compiling:CompileStats
segfuse.torch.capturing.lowering:alternatives segfuse.torch.capturing.lowering:lower_generic
segfuse.torch.capturing.lowering:lowering_of segfuse.torch.capturing.lowering:registered_lowerings
segfuse.compiler.errors:DeferredRunError
segfuse.server:create_app segfuse.server.array_backends:resolve segfuse.server.logs:JsonFormatter
segfuse.server.settings:Settings segfuse.server.settings:parse_size
""".split())

FROM = re.compile(r"\bfrom\s+(segfuse(?:\.\w+)*)\s+import\s+(\([^)]*\)|[\w ,]+)")
IMPORT = re.compile(r"(?<![\w.])import\s+(segfuse(?:\.\w+)+)(?:\s+as\s+(\w+))?")
REFERENCE = re.compile(r"`(segfuse\.(?:compiler|server|client|scaleout|cli|torch)(?:\.\w+)*)")


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for d, pats in (("docs", ("*.md", "*.py")), ("examples", ("*.md", "*.py")), ("benchmarks", ("*.md", "*.py", "*.sh"))):
        for pat in pats:
            files += sorted((ROOT / d).glob(pat))
    return files


def _module_and_name(dotted: str) -> str:
    """`segfuse.client.RunResult` -> `segfuse.client:RunResult` (the longest importable prefix)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return ".".join(parts[:i]) + ":" + ".".join(parts[i:])
    return dotted + ":"


def used_paths() -> dict[str, list[str]]:
    """"module:name" -> where ("file:line") for every segfuse import path the files use."""
    found: dict[str, list[str]] = {}

    def add(path, f, text, pos):
        found.setdefault(path, []).append(f"{f.relative_to(ROOT)}:{text.count(chr(10), 0, pos) + 1}")

    for f in scanned_files():
        text = f.read_text()
        for m in FROM.finditer(text):
            for item in m.group(2).strip("()").replace("\n", " ").split(","):
                name, _, alias = (w.strip() for w in item.partition(" as "))
                if name:
                    add(f"{m.group(1)}:{name}", f, text, m.start())
                    if alias:  # `from pkg import module as alias`: the attributes used through it
                        for a in re.finditer(rf"(?<![\w.]){re.escape(alias)}\.(\w+)", text):
                            add(f"{m.group(1)}.{name}:{a.group(1)}", f, text, a.start())
        for m in IMPORT.finditer(text):
            add(f"{m.group(1)}:", f, text, m.start())
            if m.group(2):
                for a in re.finditer(rf"(?<![\w.]){re.escape(m.group(2))}\.(\w+)", text):
                    add(f"{m.group(1)}:{a.group(1)}", f, text, a.start())
        for m in REFERENCE.finditer(text):
            path = _module_and_name(m.group(1))
            if not path.endswith(":"):  # a bare package name in prose pins nothing beyond itself
                add(path, f, text, m.start())
    return found


def resolves(path: str) -> str | None:
    """None if `module:name` imports and the name exists, else why not."""
    module, _, name = path.partition(":")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        return f"import {module}: {e}"
    for part in filter(None, name.split(".")):
        if not hasattr(obj, part) and hasattr(obj, "__path__"):
            try:  # `from package import submodule` imports it, whether or not it was imported before
                importlib.import_module(f"{obj.__name__}.{part}")
            except ImportError:
                pass
        if not hasattr(obj, part):
            return f"{module} has no {name}"
        obj = getattr(obj, part)
    return None


@pytest.mark.parametrize("package, expected", [("segfuse.compiler", COMPILER_ALL), ("segfuse.client", CLIENT_ALL),
                                               ("segfuse.server", SERVER_ALL), ("segfuse.scaleout", SCALEOUT_ALL),
                                               ("segfuse.torch", TORCH_ALL)])
def test_all_is_pinned(package, expected):
    mod = importlib.import_module(package)
    assert sorted(mod.__all__) == sorted(expected), (
        f"{package}.__all__ changed: added {sorted(set(mod.__all__) - set(expected))}, "
        f"removed {sorted(set(expected) - set(mod.__all__))}")
    assert [n for n in expected if not hasattr(mod, n)] == []


@pytest.mark.parametrize("path", PINNED_PATHS)
def test_pinned_path_imports(path):
    assert resolves(path) is None, resolves(path)


def test_paths_used_by_docs_examples_and_benchmarks_import():
    broken = {p: (why, where) for p, where in used_paths().items() if (why := resolves(p))}
    assert not broken, "\n".join(f"{p}: {why} (used at {', '.join(where)})" for p, (why, where) in broken.items())


def test_paths_used_are_pinned():
    used = used_paths()
    assert len(used) > 20, "the scan found almost nothing: check the patterns"
    new = sorted(set(used) - set(PINNED_PATHS))
    assert not new, ("paths used but not in PINNED_PATHS (add them, the public surface grew):\n" +
                     "\n".join(f"{p} (at {', '.join(used[p])})" for p in new))


def test_the_client_loads_only_the_dtype_table_of_the_compiler():
    """`import segfuse.client` (httpx and NumPy) must not drag in the planner, codegen, sympy or
    pydantic: segfuse.compiler's public names load on first use."""
    import subprocess
    import sys

    code = ("import sys, segfuse.client; "
            "print(sorted(m for m in sys.modules if m.startswith('segfuse.compiler')), 'sympy' in sys.modules, "
            "'pydantic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['segfuse.compiler', 'segfuse.compiler.dtypes'] False False", out


def test_the_clients_old_error_name_still_works_with_a_warning():
    import segfuse.client as client

    with pytest.warns(DeprecationWarning, match="ClientError"):
        old = client.SegfuseError
    assert old is client.ClientError and not issubclass(old, importlib.import_module("segfuse.compiler").SegfuseError)


def test_lazy_names_and_submodules_resolve():
    import segfuse.compiler as sc

    assert sc.Engine.__module__ == "segfuse.compiler.engine" and sc.FusionDefinition.__name__ == "FusionDefinition"
    assert sc.engine.Engine is sc.Engine  # a submodule reached as an attribute
    assert set(sc.__all__) <= set(dir(sc))
    try:
        sc.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_the_cli_is_its_own_package_and_the_console_script_runs_it():
    # (issue 14: one CLI, `segfuse.cli`; the old path inside the compiler is gone, no shim)
    import importlib.util

    assert importlib.util.find_spec("segfuse.compiler.cli") is None
    script = re.search(r'^segfuse = "([\w.]+):(\w+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert script and script.groups() == ("segfuse.cli", "main")
    assert callable(importlib.import_module("segfuse.cli").main)
