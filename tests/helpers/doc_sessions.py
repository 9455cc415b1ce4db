"""The command blocks of a Markdown page, run as a reader runs them, and what they print compared
with what the page shows (tests/test_docs_commands.py runs every docs/*.md page this way).

How a page marks its blocks:

- A ```console block is a shell session: a line starting with `$ ` is a command (a line ending in
  `\\` continues it), and the lines after it, up to the next command, are what it prints.
- A ```bash (or ```sh) block is commands with no output shown: it must exit 0, and print no error
  body (`"error"`).
- A ```python block is a script; when the next block comes after a line `printed` (or `prints:`),
  that block is what the script prints.
- `<!-- not run: <why> -->` on the line before a block marks it illustrative: it is not run (it
  needs a GPU, a cluster, a network, ...). README.md's older `<!-- no-ci -->` means the same.
- `<!-- file: NAME -->` before a block writes its text to NAME when the page reaches it (a graph or
  a script the following commands use); it does not run.
- `<!-- server PORT: [VAR=value ...] segfuse serve [flags] -->` anywhere in the page declares the
  server that `localhost:PORT` stands for. Without one, a page has `8000: segfuse serve --backend
  numpy`. Each page gets fresh servers, started when a block first names one's address.

Any other block (json, text, mermaid, ...) is not a command; a block holding `$ ` lines must be a
console block or be marked.

Where the commands run: in order, each in its own bash (`$?` is the status of the command before),
in a scratch directory that mirrors the repository root (its top-level entries are linked there,
so paths are relative to the root and files a command writes stay in the scratch directory), with
this interpreter's `python`, `python3` and `segfuse` first on PATH and no SEGFUSE_* variable set.
`localhost:PORT` and `127.0.0.1:PORT` become the address of the page's server for PORT (a command
that needs a server names it: `--server localhost:8000`).

How output is compared: trailing spaces and the blank lines at either end are ignored; in the shown
output `...` stands for any text within a line, and a line of only `...` for any number of lines.
What differs from run to run is masked on both sides before comparing: the numbers of
`timings_us`, `ns` and `last_inference`, the value of a `*_created` metric, object addresses
(`0x7f...`), and the servers' real ports.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from helpers.processes import ROOT, free_port, stop, wait_ready
from helpers.waiting import scaled

RUN_LANGS = {"console", "bash", "sh", "python"}
_FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)(.*)$")
_DIRECTIVE = re.compile(r"^<!--\s*(not run:.*?|no-ci|file:\s*\S+)\s*-->$")
_SERVER = re.compile(r"<!--\s*server\s+(\d+):\s*(.*?)\s*-->")
_PRINTED = re.compile(r"^(printed|prints):?$", re.IGNORECASE)
DEFAULT_SERVER = "segfuse serve --backend numpy"


@dataclass
class Block:
    page: Path
    line: int  # the opening fence, 1-based
    lang: str
    code: str
    directive: str = ""  # "not run: ...", "no-ci", "file: NAME" or ""
    expected: str | None = None  # a python block's shown output
    is_output: bool = False  # this block is the shown output of the python block before it

    @property
    def runs(self) -> bool:
        return self.lang in RUN_LANGS and not self.is_output and not self.directive

    @property
    def where(self) -> str:
        return f"{_rel(self.page)}:{self.line}"


@dataclass
class Step:
    """One command of a console block and what the page shows it printing."""
    line: int
    command: str
    expected: str


@dataclass
class Mismatch:
    where: str
    command: str
    expected: str
    got: str

    def __str__(self) -> str:
        diff = "\n".join(difflib.unified_diff(masked(self.expected).splitlines(), masked(self.got).splitlines(),
                                              "shown", "printed", lineterm="", n=1))
        cmd = self.command if len(self.command) < 400 else self.command[:400] + " ..."
        return f"{self.where}: {cmd}\n{diff or self.got}"


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def blocks(page: Path) -> list[Block]:
    """Every fenced block of the page, with its directive and, for a python block, its shown output."""
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, start, body = m.group(1), i, []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i])
            i += 1
        i += 1
        prev_text = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        d = _DIRECTIVE.match(prev_text)
        block = Block(page, start + 1, m.group(2).lower(), "\n".join(body) + "\n", d.group(1) if d else "")
        if out and out[-1].lang == "python" and out[-1].expected is None and _PRINTED.match(prev_text) \
                and not block.directive:
            out[-1].expected, block.is_output = block.code, True
        out.append(block)
    return out


def unmarked_sessions(page: Path) -> list[str]:
    """Blocks that hold `$ ` command lines but are neither console blocks nor marked."""
    return [b.where for b in blocks(page) if b.lang != "console" and not b.directive and not b.is_output
            and any(ln.startswith("$ ") for ln in b.code.splitlines())]


def steps(block: Block) -> list[Step]:
    """The commands of a console block, each with the lines it prints."""
    out: list[Step] = []
    lines = block.code.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            if lines[i].strip() and not out:
                raise ValueError(f"{block.where}: a console block starts with a `$ ` command line")
            if out:
                out[-1].expected += lines[i] + "\n"
            i += 1
            continue
        line, cmd = block.line + 1 + i, lines[i][2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd + "\n" + lines[i]
        out.append(Step(line, cmd, ""))
        i += 1
    return out


# ---- comparing -----------------------------------------------------------------------------------
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_MASKS = [
    (re.compile(r"""(["']timings_us["']:\s*\{)([^}]*)(\})"""),
     lambda m: m.group(1) + _NUMBER.sub("N", m.group(2)) + m.group(3)),
    (re.compile(r"""(["'](?:ns|last_inference)["']:\s*)\d+"""), r"\1N"),
    (re.compile(r"^(\w+_created(?:\{[^}]*\})?) \S+$", re.MULTILINE), r"\1 N"),
    (re.compile(r"\b0x[0-9a-f]{6,}\b"), "0xN"),
]
_VARYING_KEYS = {"ns", "last_inference"}


def _masked(obj):
    if isinstance(obj, dict):
        return {k: ({t: "N" for t in v} if k == "timings_us" and isinstance(v, dict)
                    else "N" if k in _VARYING_KEYS else _masked(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_masked(v) for v in obj]
    return obj


def _canonical(line: str) -> str:
    """A line holding one JSON value or Python literal (a dict, a list), as sorted JSON with its
    varying values masked: the order of keys is no part of what a command prints. Other lines
    unchanged."""
    if not line.lstrip().startswith(("{", "[")):
        return line
    for parse in (json.loads, ast.literal_eval):
        try:
            return json.dumps(_masked(parse(line)), sort_keys=True, default=repr)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return line


def normalize(text: str, ports: dict[int, int] | None = None) -> str:
    """The text as compared: the servers' real ports back to the page's (`ports`: real -> the
    page's), lines right-stripped, blank lines at the ends dropped."""
    for real, shown in (ports or {}).items():
        text = text.replace(f"127.0.0.1:{real}", f"127.0.0.1:{shown}").replace(f"localhost:{real}", f"127.0.0.1:{shown}")
    text = re.sub(r"\blocalhost:(\d+)", r"127.0.0.1:\1", text)
    return "\n".join(ln.rstrip() for ln in text.splitlines()).strip("\n")


def masked(text: str) -> str:
    """`text` (normalized) with what varies from run to run masked (see the module's docstring)."""
    text = "\n".join(_canonical(ln) for ln in text.splitlines())
    for pattern, repl in _MASKS:
        text = pattern.sub(repl, text)
    return text


def matches(shown: str, printed: str) -> bool:
    """Whether `printed` is what `shown` shows (both normalized). Without `...`, line by line with
    JSON lines compared as values; with it, `...` stands for any text (a line of it: any lines)."""
    if "..." not in shown:
        return masked(shown) == masked(printed)
    pattern = ""
    for ln in masked(shown).splitlines():
        if ln.strip() == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += r"[^\n]*?".join(re.escape(part) for part in ln.split("...")) + "\n"
    text = "\n".join(ln for ln in masked(printed).splitlines())
    return re.fullmatch(pattern, text + "\n" if text else "") is not None


# ---- running ---------------------------------------------------------------------------------------
@dataclass
class Server:
    port: int  # the port the page names
    env: dict
    args: list[str]  # after `segfuse serve`


def servers(page: Path) -> list[Server]:
    """The servers the page declares (`<!-- server PORT: ... -->`), else the default one on 8000."""
    declared = _SERVER.findall(page.read_text()) or [("8000", DEFAULT_SERVER)]
    out = []
    for port, command in declared:
        words = shlex.split(command)
        env = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            k, v = words.pop(0).split("=", 1)
            env[k] = v
        if words[:2] != ["segfuse", "serve"]:
            raise ValueError(f"{_rel(page)}: a declared server runs `segfuse serve ...`, not {command!r}")
        out.append(Server(int(port), env, words[2:]))
    return out


def _without_segfuse_settings(env) -> dict:
    """The environment without SEGFUSE_* settings (a reader's shell has none; a page declares its own)."""
    return {k: v for k, v in env.items() if not k.startswith("SEGFUSE_")}


def _segfuse() -> str:
    script = Path(sysconfig.get_path("scripts")) / "segfuse"
    return str(script) if script.exists() else shutil.which("segfuse") or "segfuse"


@dataclass
class PageRun:
    """A page's scratch directory, environment and servers; `run(block)` runs one block."""
    page: Path
    workdir: Path
    urls: dict[int, str] = field(default_factory=dict)  # the page's port -> the real server's URL
    _procs: list = field(default_factory=list)

    def start_servers(self) -> None:
        started = []
        for s in servers(self.page):
            real = free_port()
            env = {**_without_segfuse_settings(os.environ), **s.env}
            log = open(self.workdir / f".server-{s.port}.log", "w")  # a file: a full pipe would stall it
            proc = subprocess.Popen([_segfuse(), "serve", *s.args, "--host", "127.0.0.1", "--port", str(real)],
                                    env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
            self._procs.append((proc, log))
            started.append((s.port, f"http://127.0.0.1:{real}", proc))
        for port, url, proc in started:
            try:
                wait_ready(url, proc)
            except RuntimeError:
                raise RuntimeError(f"{_rel(self.page)}: server {port} did not start:\n"
                                   f"{(self.workdir / f'.server-{port}.log').read_text()}") from None
            self.urls[port] = url

    def close(self) -> None:
        for proc, log in self._procs:
            stop(proc)
            log.close()

    @property
    def env(self) -> dict:
        return {**_without_segfuse_settings(os.environ), "COLUMNS": "120",
                "PATH": os.pathsep.join([str(self.workdir / ".bin"), os.environ.get("PATH", "")])}

    @property
    def ports(self) -> dict[int, int]:
        return {int(url.rsplit(":", 1)[1]): port for port, url in self.urls.items()}

    def names_a_server(self, code: str) -> bool:
        return any(re.search(rf"\b(?:localhost|127\.0\.0\.1):{s.port}\b", code) for s in servers(self.page))

    def addressed(self, code: str) -> str:
        for port, url in self.urls.items():
            real = url.removeprefix("http://")
            code = re.sub(rf"\b(?:localhost|127\.0\.0\.1):{port}\b", real, code)
        return code

    def _run(self, cmd: list[str]) -> tuple[int, str]:
        try:
            r = subprocess.run(cmd, cwd=self.workdir, env=self.env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=scaled(300))
        except subprocess.TimeoutExpired as e:  # a hang guard, not a speed limit
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
            return -1, out + "\n[no answer: stopped after a long wait]"
        return r.returncode, r.stdout

    def run(self, block: Block, status: int = 0) -> tuple[list[Mismatch], int]:
        """Run one block; the mismatches it shows, and the exit status of its last command."""
        writes = block.directive.startswith("file:")
        if not (block.runs or writes):
            return [], status
        if not self.urls and self.names_a_server(block.code):
            self.start_servers()
        if writes:
            (self.workdir / block.directive.split(":", 1)[1].strip()).write_text(self.addressed(block.code))
            return [], status
        if block.lang == "console":
            found = []
            for step in steps(block):
                status, out = self._run(["bash", "-c", f"(exit {status}); {self.addressed(step.command)}"])
                shown, printed = normalize(step.expected), normalize(out, self.ports)
                if not matches(shown, printed):
                    found.append(Mismatch(f"{_rel(block.page)}:{step.line}", "$ " + step.command, shown, printed))
            return found, status
        if block.lang == "python":
            script = self.workdir / f".block_{block.line}.py"
            script.write_text(self.addressed(block.code))
            status, out = self._run([sys.executable, str(script)])
        else:
            status, out = self._run(["bash", "-euo", "pipefail", "-c", self.addressed(block.code)])
        printed = normalize(out, self.ports)
        if status != 0 or (block.lang != "python" and '"error"' in out):
            return [Mismatch(block.where, f"({block.lang} block, exit {status})", "", printed)], status
        if block.expected is not None and not matches(normalize(block.expected), printed):
            return [Mismatch(block.where, f"({block.lang} block)", normalize(block.expected), printed)], status
        return [], status


@contextlib.contextmanager
def page_run(page: Path):
    """A PageRun in a fresh scratch directory that mirrors the repository root."""
    with tempfile.TemporaryDirectory(prefix=f"doc-{page.stem}-") as tmp:
        work = Path(tmp)
        for entry in ROOT.iterdir():
            if entry.name != ".git":
                (work / entry.name).symlink_to(entry)
        bin_dir = work / ".bin"
        bin_dir.mkdir()
        for name in ("python", "python3"):  # wrappers, not links: a venv is found next to the real path
            (bin_dir / name).write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
            (bin_dir / name).chmod(0o755)
        (bin_dir / "segfuse").symlink_to(_segfuse())
        run = PageRun(page, work)
        try:
            yield run
        finally:
            run.close()


def run_page(page: Path) -> list[Mismatch]:
    """Run every block of the page in order; every place its output differs from the page."""
    found: list[Mismatch] = []
    with page_run(page) as run:
        status = 0
        for block in blocks(page):
            mismatches, status = run.run(block, status)
            found += mismatches
    return found
