"""Layers import downward only (issue 14): a short AST walk over every module of `segfuse.compiler`,
`segfuse.server` and `segfuse.client` collects every intra-project import -- at module level, inside
functions, and under `if TYPE_CHECKING:` -- resolves it (relative imports too) to a segfuse module,
and checks it against LAYERS below.

A violation is an import of a module of a higher layer, a client module importing anything but the
client and the dtype table, a module outside the compiler importing a backend's internals
(`compiler/cuda/`, `compiler/numpy_backend.py`: the Engine is the way in; benchmark and example
scripts are held to that too), or an import edge inside a cycle (a strongly connected component of the
runtime import graph; `TYPE_CHECKING` imports do not run and are left out of cycles, not of layers).
Today's violations are listed in tests/data/layering_allowlist.txt; the list may only shrink:
a new violation fails, and so does a listed one that no longer occurs (delete its line).

`python tests/test_layering.py` prints the counts, the cycles and every violation.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWLIST = Path(__file__).resolve().parent / "data" / "layering_allowlist.txt"

# Bottom to top; a module may import its own layer or a lower one. Patterns are fnmatch patterns over
# dotted module names (a package is its own name, e.g. "segfuse.compiler.ops" for ops/__init__.py);
# every module must match exactly one.
LAYERS: list[tuple[str, list[str]]] = [
    ("core", ["segfuse.compiler.dtypes", "segfuse.compiler.errors", "segfuse.compiler.shapes",
              "segfuse.compiler.limits"]),
    ("ops", ["segfuse.compiler.ops", "segfuse.compiler.ops.*"]),
    ("ir", ["segfuse.compiler.schema", "segfuse.compiler.spec_errors", "segfuse.compiler.ir"]),
    # the plan model, the segmenter and its parts, the plan cache, the reference planner
    ("plan", ["segfuse.compiler.plan", "segfuse.compiler.segmenter", "segfuse.compiler.segmenter.*"]),
    # pure text (the corpus that drives it is test data: tests/corpus/)
    ("codegen", ["segfuse.compiler.codegen.*"]),
    # the CPU backend (numpy reference evaluator, plan executor) and the CUDA one
    ("backends", ["segfuse.compiler.backend", "segfuse.compiler.commit", "segfuse.compiler.numpy_backend",
                  "segfuse.compiler.plan_executor",
                  "segfuse.compiler.cuda",
                  "segfuse.compiler.cuda.*"]),
    ("engine", ["segfuse.compiler.engine"]),
    ("frontend", ["segfuse.compiler.builder", "segfuse.compiler.builder_*"]),
    # the package facade re-exports the builder, so it sits above it
    ("api", ["segfuse.compiler"]),
    # the service layer: the server and the client (see CLIENT_MAY_IMPORT)
    # and segfuse.torch (fusions as torch ops: the engine and the CUDA backend, from PyTorch programs)
    ("service", ["segfuse.server", "segfuse.server.*", "segfuse.client", "segfuse.client.*",
                 "segfuse.torch", "segfuse.torch.*"]),
    # shards of the server behind the router: may use the server and the client, not the reverse
    ("scaleout", ["segfuse.scaleout", "segfuse.scaleout.*"]),
    ("cli", ["segfuse.cli", "segfuse.cli.*"]),
]
# Outside its own package the client needs only the dtype table.
CLIENT_MAY_IMPORT = {"segfuse.compiler.dtypes"}
# A backend's internals: outside the compiler, code goes through the Engine (or the Backend it
# hands out, `Engine.device_backend`): the product packages, and the scripts below.
BACKEND_INTERNALS = ["segfuse.compiler.cuda", "segfuse.compiler.cuda.*", "segfuse.compiler.numpy_backend"]
SCRIPT_DIRS = ["benchmarks", "examples"]  # (files under benchmarks/lab/, the lab's own, are not checked)

KINDS = ("module level", "in function", "type checking")


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    kind: str
    line: int


def package_dirs() -> dict[str, Path]:
    """Dotted package name -> source directory, from pyproject.toml's package-dir mapping."""
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+; the project supports 3.10)
    line = re.search(r"^package-dir\s*=\s*\{(.*)\}", text, re.M).group(1)
    mapping = dict(re.findall(r'"([\w.]+)"\s*=\s*"([\w./-]+)"', line))
    assert mapping, "no package-dir mapping in pyproject.toml"
    return {pkg: ROOT / d for pkg, d in mapping.items()}


def module_files(dirs: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package __init__)."""
    mods = {}
    for pkg, d in dirs.items():
        for f in sorted(d.rglob("*.py")):
            parts = list(f.relative_to(d).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts.pop()
            mods[".".join([pkg, *parts])] = (f, is_pkg)
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(name: str, mods) -> str | None:
    """The longest segfuse module that `name` (a module or module.attribute) names."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def _targets(node, package: str, mods) -> list[str]:
    """The dotted names an import statement imports (`from pkg import sub` names the submodule)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = package.split(".")
        base = base[:len(base) - (node.level - 1)]
        src = ".".join(base + ([node.module] if node.module else []))
    else:
        src = node.module or ""
    return [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src for a in node.names]


def _module_imports(mod: str, path: Path, is_pkg: bool, mods) -> list[tuple[ast.stmt, str, set[str]]]:
    """(statement, kind, segfuse modules it imports) for every import statement of one module."""
    package = mod if is_pkg else mod.rpartition(".")[0]
    found = []

    def visit(node, kind):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test) and kind == "module level":
                for sub in child.body:
                    visit_one(sub, "type checking")
                for sub in child.orelse:
                    visit_one(sub, kind)
            else:
                visit_one(child, kind)

    def visit_one(child, kind):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            targets = {r for r in (_resolve(t, mods) for t in _targets(child, package, mods)) if r and r != mod}
            if targets:
                found.append((child, kind, targets))
        visit(child, "in function" if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else kind)

    visit(ast.parse(path.read_text(), str(path)), "module level")
    return found


def collect(mods: dict[str, tuple[Path, bool]]) -> tuple[list[Import], int, int]:
    """Every intra-project import edge; also the number of intra-project import statements and of
    those inside functions."""
    edges: list[Import] = []
    statements = in_function = 0
    for mod, (path, is_pkg) in mods.items():
        for stmt, kind, targets in _module_imports(mod, path, is_pkg, mods):
            statements += 1
            in_function += kind == "in function"
            edges.extend(Import(mod, t, kind, stmt.lineno) for t in sorted(targets))
    return edges, statements, in_function


def _in_compiler(mod: str) -> bool:
    return mod == "segfuse.compiler" or mod.startswith("segfuse.compiler.")


def _backend_internal(mod: str) -> bool:
    return any(fnmatch.fnmatchcase(mod, p) for p in BACKEND_INTERNALS)


def script_files() -> list[Path]:
    files = []
    for d in SCRIPT_DIRS:
        files += [f for f in sorted((ROOT / d).rglob("*.py")) if "lab" not in f.relative_to(ROOT / d).parts[:1]]
    return files


def script_imports_of_backend_internals(mods) -> list[str]:
    """"file:line module" for every import of a backend's internals by a script (benchmarks/,
    examples/): absolute imports only (scripts are not packages), at any depth of the file."""
    found = []
    for f in script_files():
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                for target in _targets(node, "", mods):
                    if _backend_internal(_resolve(target, mods) or target):
                        found.append(f"{f.relative_to(ROOT)}:{node.lineno} {target}")
    return found


def layer_of(mod: str) -> int | None:
    hits = [i for i, (_, pats) in enumerate(LAYERS) for p in pats if fnmatch.fnmatchcase(mod, p)]
    return hits[0] if len(hits) == 1 else None


def cycles(edges: list[Import]) -> list[list[str]]:
    """Strongly connected components (more than one module) of the runtime import graph (Tarjan)."""
    graph = defaultdict(set)
    for e in edges:
        if e.kind != "type checking":
            graph[e.importer].add(e.imported)
    index, low, stack, on, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(out, key=lambda c: (-len(c), c))


@dataclass
class Report:
    modules: int
    statements: int
    in_function: int
    edges: list[Import]
    cycles: list[list[str]]
    violations: dict[tuple[str, str, str], str]  # (importer, imported, kind) -> why
    unassigned: list[str]

    def summary(self) -> str:
        fn = sum(e.kind == "in function" for e in self.edges)
        tc = sum(e.kind == "type checking" for e in self.edges)
        lines = [f"{self.modules} modules; {len(self.edges)} intra-project imports (module-to-module edges), "
                 f"{fn} of them inside functions ({fn / max(1, len(self.edges)):.0%}), {tc} under TYPE_CHECKING; "
                 f"{self.statements} import statements, {self.in_function} inside functions; "
                 f"{len(self.violations)} violations; {len(self.cycles)} cycles:"]
        lines += [f"  ({len(c)}) " + ", ".join(m.removeprefix("segfuse.") for m in c) for c in self.cycles]
        return "\n".join(lines)


def analyse() -> Report:
    mods = module_files(package_dirs())
    edges, statements, in_function = collect(mods)
    comps = cycles(edges)
    comp_of = {m: i for i, c in enumerate(comps) for m in c}
    names = [n for n, _ in LAYERS]
    violations: dict[tuple[str, str, str], str] = {}
    for e in edges:
        why = []
        a, b = layer_of(e.importer), layer_of(e.imported)
        if a is not None and b is not None and b > a:
            why.append(f"upward {names[a]} -> {names[b]}")
        if e.importer.startswith("segfuse.client") and not e.imported.startswith("segfuse.client") \
                and e.imported not in CLIENT_MAY_IMPORT:
            why.append("client beyond the dtype table")
        if not _in_compiler(e.importer) and _backend_internal(e.imported):
            why.append("a backend's internals outside the compiler (go through the Engine)")
        if e.kind != "type checking" and e.importer in comp_of and comp_of[e.importer] == comp_of.get(e.imported):
            why.append(f"cycle of {len(comps[comp_of[e.importer]])}")
        if why:
            violations[(e.importer, e.imported, e.kind)] = "; ".join(why)
    return Report(len(mods), statements, in_function, edges, comps, violations,
                  sorted(m for m in mods if layer_of(m) is None))


def entry_line(key: tuple[str, str, str], why: str) -> str:
    return f"{key[0]} | {key[1]} | {key[2]}  # {why}"


def read_allowlist() -> set[tuple[str, str, str]]:
    keys = set()
    for raw in ALLOWLIST.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            parts = tuple(p.strip() for p in line.split("|"))
            assert len(parts) == 3 and parts[2] in KINDS, f"{ALLOWLIST.name}: malformed line {raw!r}"
            keys.add(parts)
    return keys


_REPORT: Report | None = None


def report() -> Report:
    global _REPORT
    if _REPORT is None:
        _REPORT = analyse()
    return _REPORT


def test_every_module_has_one_layer():
    r = report()
    assert not r.unassigned, (f"modules matching no layer (or more than one) in LAYERS of {Path(__file__).name}: "
                              f"{r.unassigned}")


def test_walk_sees_the_known_imports():
    """The walk finds imports inside functions and relative imports (guards against a silent no-op)."""
    keys = {(e.importer, e.imported, e.kind) for e in report().edges}
    assert ("segfuse.compiler.segmenter.place", "segfuse.compiler.segmenter.graph", "module level") in keys
    assert any(k[2] == "in function" for k in keys) and report().statements > 200


def test_no_new_layering_violations():
    r = report()
    new = sorted(set(r.violations) - read_allowlist())
    lines = "\n".join(entry_line(k, r.violations[k]) + "   (line " +
                      ", ".join(str(e.line) for e in r.edges if (e.importer, e.imported, e.kind) == k) + ")"
                      for k in new)
    assert not new, (f"{len(new)} new layering violation(s): import from this layer or below (see LAYERS in "
                     f"{Path(__file__).name}), or break the cycle; do not add them to {ALLOWLIST.name}.\n"
                     f"{lines}\n\n{r.summary()}")


def test_nothing_outside_the_compiler_imports_a_backends_internals():
    """The server, the client, segfuse.torch, scale-out and the CLI (checked as layering violations
    above), and the benchmark and example scripts, reach a backend only through the Engine."""
    r = report()
    product = sorted(k for k in r.violations if not _in_compiler(k[0]) and _backend_internal(k[1]))
    assert not product, product
    scripts = script_imports_of_backend_internals(module_files(package_dirs()))
    assert not scripts, "scripts importing a backend's internals (use the Engine's API):\n" + "\n".join(scripts)


def test_the_script_walk_sees_the_scripts():
    names = {f.name for f in script_files()}
    assert {"bench_gpu.py", "bench_prologue.py"} <= names and any(f.parent.name == "examples" for f in script_files())


def test_allowlist_only_shrinks():
    r = report()
    stale = sorted(read_allowlist() - set(r.violations))
    assert not stale, (f"{len(stale)} line(s) of tests/data/{ALLOWLIST.name} no longer occur -- fixed, thank you: "
                       "delete them.\n" + "\n".join(" | ".join(k) for k in stale) + f"\n\n{r.summary()}")


def test_server_modules_form_no_cycle_even_through_type_hints():
    """Inside the server a `TYPE_CHECKING` import counts too: a cycle closed by type hints means
    modules that cannot be read (or split) one without the other."""
    inside = [e for e in report().edges
              if e.importer.startswith("segfuse.server.") and e.imported.startswith("segfuse.server.")]
    assert any(e.kind == "type checking" for e in inside)  # the walk sees type-hint imports
    found = cycles([Import(e.importer, e.imported, "module level", e.line) for e in inside])
    assert not found, f"import cycles inside segfuse.server (type hints included): {found}"


if __name__ == "__main__":
    r = report()
    print(r.summary())
    print(f"\n{len(r.violations)} violations:")
    for k in sorted(r.violations):
        print(entry_line(k, r.violations[k]))
