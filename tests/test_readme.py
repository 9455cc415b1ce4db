"""The docs cannot rot: every ```bash and ```python block of README.md runs
here against a live server (NumPy backend), except blocks preceded by `<!-- no-ci -->`; every
example in examples/ runs too, in-process and through the service.

Blocks run in order in one scratch directory (where `examples/` is linked in), so a block may
use files an earlier one wrote. `127.0.0.1:8000` in a block is replaced by the test server's
address.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers.processes import ROOT, server_process
from helpers.waiting import scaled
from segfuse.client import Buffer, Client
from segfuse.compiler import Engine, load_fusion

NO_CI = "<!-- no-ci -->"
DOCS = [ROOT / "README.md"]  # docs/*.md: tests/test_docs_commands.py
EXAMPLES = ROOT / "examples"


@dataclass
class Block:
    path: Path
    line: int  # where the fence opens, 1-based
    lang: str
    code: str
    ci: bool

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} ({self.lang})"


def code_blocks(path: Path) -> list[Block]:
    blocks, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w+)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        prev = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        blocks.append(Block(path, start + 1, m.group(1), "\n".join(body) + "\n", prev != NO_CI))
        i += 1
    return blocks


def section(path: Path, title: str) -> str:
    text = path.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


# ---- the quick start ------------------------------------------------------------------------------
def ci_commands() -> list[list[str]]:
    lines = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines()
             if ln.strip().startswith(("python", "pip"))]
    return [shlex.split(ln) for ln in lines]


def test_quick_start_is_two_commands_and_the_second_is_what_ci_runs():
    quick = section(ROOT / "README.md", "Quick start")
    blocks = [b for b in code_blocks(ROOT / "README.md") if f"```{b.lang}\n{b.code}" in quick]
    commands = [b.code.strip() for b in blocks]
    assert len(commands) == 2 and all("\n" not in c for c in commands), commands
    assert commands[0] == 'pip install -e ".[server]" && segfuse serve'

    install, test = (shlex.split(part) for part in commands[1].split(" && "))
    ci_install, ci_test = ci_commands()
    # CI says `python3 -m pip install -q ...`; the README says `pip install`: same extras, same editable install
    assert install[:3] == ["pip", "install", "-e"] and install[3] in ci_install and "-e" in ci_install
    assert [("python" if w == "python3" else w) for w in ci_test] == test == \
        ["python", "-m", "pytest", "-q", "-n", "2"]


def test_every_code_block_is_bash_python_or_marked():
    langs = {b.lang for path in DOCS for b in code_blocks(path)}
    assert langs <= {"bash", "python", "text", "mermaid"}, langs
    runnable = [b for b in code_blocks(ROOT / "README.md") if b.ci]
    assert sum(b.lang == "python" for b in runnable) >= 3 and sum(b.lang == "bash" for b in runnable) >= 3



def table_cells(path: Path) -> list[str]:
    return [cell.strip() for line in path.read_text().splitlines() if line.startswith("|")
            for cell in line.strip().strip("|").split(" | ")]


@pytest.mark.parametrize(("doc", "limit"), [("README.md", 13_000), ("benchmarks/README.md", 30_000)])
def test_front_pages_stay_short_with_short_table_cells(doc, limit):
    """A newcomer reads these first: the detail belongs in docs/ and dated logs in git history."""
    path = ROOT / doc
    assert len(path.read_bytes()) <= limit
    long = [c[:80] for c in table_cells(path) if len(c) > 300]
    assert not long, long

# ---- running the blocks -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    with server_process() as url:
        yield url


@pytest.fixture
def scratch(tmp_path):
    (tmp_path / "examples").symlink_to(EXAMPLES)
    bin_dir = tmp_path / ".bin"  # `python` and `segfuse` of this interpreter, whatever PATH has
    bin_dir.mkdir()
    python = bin_dir / "python"  # a wrapper, not a symlink: a venv is found next to the real path
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    env = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent),
                                                  os.environ.get("PATH", "")])}
    env.pop("SEGFUSE_TOKEN", None)
    env.pop("SEGFUSE_SERVER", None)
    return tmp_path, env


def run_block(block: Block, server: str, cwd: Path, env: dict) -> str:
    code = block.code.replace("127.0.0.1:8000", server.removeprefix("http://"))
    if block.lang == "bash":
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    else:
        script = cwd / f"block_{block.line}.py"
        script.write_text(code)
        cmd = [sys.executable, str(script)]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=scaled(600))
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{block} exited {r.returncode}:\n{code}\n--- output:\n{out}"
    if block.lang == "bash":  # curl exits 0 on an HTTP error; the error body gives it away
        assert '"error"' not in r.stdout, f"{block} got an error response:\n{out}"
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_code_blocks_run(doc, server, scratch):
    cwd, env = scratch
    blocks = [b for b in code_blocks(doc) if b.ci and b.lang in ("bash", "python")]
    outputs = [run_block(b, server, cwd, env) for b in blocks]
    if doc.name == "README.md":
        joined = "\n".join(outputs)
        assert "200" in outputs[0]  # the readiness check
        assert "400 inputs disagree with the graph" in joined  # the ClientError in the client session
        assert "[256, 256, 256, 256, 256, 256, 256, 256]" in joined  # the async session
        assert np.load(cwd / "counts.npy").shape == (16,)


# ---- examples/ ---------------------------------------------------------------------------------------
def example_inputs(name: str, rng: np.random.Generator) -> dict:
    """Valid inputs for each example graph (indices in range). A new example needs an entry."""
    T, K, E = 64, 4, 16
    if name in ("moe_problem_sizes", "moe_problem_sizes_e256"):
        experts = 256 if name.endswith("e256") else 16
        return {"topk_ids": rng.integers(0, experts, (T, 8))}
    if name in ("moe_expert_offsets", "moe_blockscale_offsets"):
        return {"tokens_per_expert": rng.integers(0, T * K, E)}
    if name == "moe_argsort":
        return {"topk_ids": rng.integers(0, E, (T, K))}
    if name == "elementwise_chain":
        return {k: rng.standard_normal(100).astype(np.float32) for k in "abc"}
    if name == "scatter_add":
        return {"dst": rng.standard_normal(10).astype(np.float32), "index": rng.integers(0, 10, 40),
                "src": rng.standard_normal(40).astype(np.float32)}
    raise KeyError(f"examples/{name}.json has no inputs in tests/test_readme.py: add them to example_inputs")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.stem)
def test_example_graph_runs_through_the_service(path, server):
    rng = np.random.default_rng(0)
    fusion = load_fusion(str(path))
    inputs = example_inputs(fusion.name, rng)
    expected = Engine.default("numpy").run(fusion, {k: v.copy() for k, v in inputs.items()}).outputs
    aliased = {o.alias_of for o in fusion.outputs if o.alias_of}
    with Client(server) as c:
        # in-place outputs need their input on the server (alias_of); the rest travel inline
        for name in aliased:
            c.put(f"{fusion.name}_{name}", inputs[name])
        sent = {k: Buffer(f"{fusion.name}_{k}") if k in aliased else v for k, v in inputs.items()}
        res = c.run(json.loads(path.read_text()), inputs=sent)
        for o in fusion.outputs:
            got = c.get(res.buffers[o.name]) if o.name in res.buffers else res[o.name]
            np.testing.assert_allclose(got, np.asarray(expected[o.name]), rtol=1e-6, err_msg=o.name)
        for name in aliased:
            c.delete(f"{fusion.name}_{name}")


@pytest.mark.parametrize("script", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_example_script_runs(script, tmp_path):
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=scaled(600))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip()
