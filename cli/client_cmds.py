"""Commands that talk to a segfuse server (`buffers`, `run --server`) and the GPU-side helpers
`warmup` and `bench`.

Server commands take `--server URL` (default $SEGFUSE_SERVER, else http://127.0.0.1:8000) and
`--token` (default $SEGFUSE_TOKEN). A server's 4xx answer or an unreachable server is a user
error (exit status 2); a 5xx is a server bug (exit status 1).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .common import UserError, load_graph, parse_pairs

DEFAULT_SERVER = "http://127.0.0.1:8000"
BUFFER_PREFIX = "buffer:"  # --input ids=buffer:ids_0 reads (or --output stores into) a server buffer

_RAW = argparse.RawDescriptionHelpFormatter


def add_server_options(p: argparse.ArgumentParser, default_server: str | None = None,
                       in_process: bool = False) -> None:
    """--server and --token. `in_process`: the command runs in-process without a server (then
    `default_server` is $SEGFUSE_SERVER, or None)."""
    default_help = "default: $SEGFUSE_SERVER; without either, run in-process" if in_process else \
        f"default: $SEGFUSE_SERVER or {DEFAULT_SERVER}"
    p.add_argument("--server", "-s", default=default_server, metavar="URL",
                   help=f"segfuse server, host:port or a URL ({default_help})")
    p.add_argument("--token", default=os.environ.get("SEGFUSE_TOKEN"),
                   help="bearer token of the server (default: $SEGFUSE_TOKEN)")


def add_parsers(sub) -> None:
    # ---- buffers ------------------------------------------------------------------------
    p = sub.add_parser("buffers", help="list, upload, download and delete buffers on a server",
                       formatter_class=_RAW, description="Manage the named buffers a segfuse server holds.",
                       epilog="examples:\n"
                              "  segfuse buffers ls --server 127.0.0.1:8000\n"
                              "  segfuse buffers put ids_0 ids.npy\n"
                              "  segfuse buffers get counts_0 counts.npy\n"
                              "  segfuse buffers rm ids_0 counts_0")
    bsub = p.add_subparsers(dest="buffers_command", metavar="ACTION")
    bsub.required = True
    q = bsub.add_parser("ls", help="list buffers", formatter_class=_RAW,
                        epilog="example:\n  segfuse buffers ls --json")
    q.add_argument("--json", action="store_true", help="print the server's JSON")
    add_server_options(q, os.environ.get("SEGFUSE_SERVER", DEFAULT_SERVER))
    q.set_defaults(func=cmd_buffers_ls)
    q = bsub.add_parser("put", help="upload a .npy file as a buffer", formatter_class=_RAW,
                        epilog="example:\n  segfuse buffers put ids_0 ids.npy")
    q.add_argument("name", help="buffer name")
    q.add_argument("file", help=".npy file to upload")
    add_server_options(q, os.environ.get("SEGFUSE_SERVER", DEFAULT_SERVER))
    q.set_defaults(func=cmd_buffers_put)
    q = bsub.add_parser("get", help="download a buffer into a .npy file", formatter_class=_RAW,
                        epilog="example:\n  segfuse buffers get counts_0 counts.npy   # '-' prints it")
    q.add_argument("name", help="buffer name")
    q.add_argument("file", nargs="?", default="-", help=".npy file to write ('-' or omitted: print)")
    add_server_options(q, os.environ.get("SEGFUSE_SERVER", DEFAULT_SERVER))
    q.set_defaults(func=cmd_buffers_get)
    q = bsub.add_parser("rm", help="delete buffers", formatter_class=_RAW,
                        epilog="example:\n  segfuse buffers rm ids_0 counts_0")
    q.add_argument("names", nargs="+", metavar="NAME", help="buffer names")
    add_server_options(q, os.environ.get("SEGFUSE_SERVER", DEFAULT_SERVER))
    q.set_defaults(func=cmd_buffers_rm)

    # ---- warmup ---------------------------------------------------------------------------
    p = sub.add_parser("warmup", help="compile a graph's kernels ahead of time for given sizes",
                       formatter_class=_RAW,
                       description="Plan, and on a GPU compile, every segment of each graph for each "
                                   "--shape, so that the kernel cache is warm before serving. On the "
                                   "NumPy backend there is nothing to compile: it plans only.",
                       epilog="examples:\n"
                              "  segfuse warmup examples/moe_problem_sizes.json --shape T=4096,K=8\n"
                              "  segfuse warmup examples/moe_*.json --shape T=1,K=8,E=16 --shape T=4096,K=8,E=256")
    p.add_argument("graphs", nargs="+", metavar="GRAPH.json", help="graph files")
    p.add_argument("--shape", action="append", default=[], metavar="SYM=N,...",
                   help="values of the graph's symbolic sizes (repeatable), e.g. T=4096,K=8")
    p.add_argument("--backend", default="auto", help="auto (cupy when a GPU is visible, else numpy), cupy or numpy")
    p.set_defaults(func=cmd_warmup)

    # ---- bench ---------------------------------------------------------------------------
    p = sub.add_parser("bench", help="run the GPU benchmarks (benchmarks/bench_gpu.py)",
                       formatter_class=_RAW,
                       description="Runs benchmarks/bench_gpu.py (segfuse against torch eager, torch.compile "
                                   "and CuPy) with a progress bar, then writes the results table "
                                   "(bench_gpu.md, bench_gpu.json) and a plot (bench_gpu.png) to --out. "
                                   "Needs a CUDA GPU and CuPy; elsewhere it says so and exits with 2.",
                       epilog="examples:\n  segfuse bench\n  segfuse bench --out /tmp/bench -- --only chain,moe")
    p.add_argument("--out", default=None,
                   help="where the table and plot go (default: the script's own out/ folder)")
    p.add_argument("--script", default=None, help="benchmark script (default: benchmarks/bench_gpu.py)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="arguments after -- go to the script (e.g. --only)")
    p.set_defaults(func=cmd_bench)


# ---- helpers ------------------------------------------------------------------------------------
def _client(args):
    from segfuse.client import Client

    try:
        return Client(args.server, token=args.token)
    except ValueError as e:
        raise UserError(str(e)) from None


def _guard(cmd):
    """For commands that talk to a server: a ClientError is printed and exits with 1 for
    a server bug (5xx), else 2 (a refused request or an unreachable server)."""
    @functools.wraps(cmd)
    def wrapper(args) -> int:
        from segfuse.client import ClientError

        try:
            return cmd(args)
        except ClientError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1 if (e.status or 0) >= 500 else 2
    return wrapper


def _load_npy(path: str, what: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot load {what} from {path}: {e}") from None


def _print_array(name: str, arr: np.ndarray) -> None:
    with np.printoptions(threshold=64, edgeitems=4):
        print(f"{name}: {arr.dtype}{list(arr.shape)}\n{arr}")


def print_listing(items: list[dict], as_json: bool, what: str, line) -> int:
    """`ls` commands: the server's JSON, or one `line(item, width)` per item (names aligned)."""
    if as_json:
        print(json.dumps(items, indent=2))
    elif not items:
        print(f"no {what}")
    else:
        width = max(len(i["name"]) for i in items)
        for i in items:
            print(line(i, width))
    return 0


# ---- buffers ------------------------------------------------------------------------------------
@_guard
def cmd_buffers_ls(args) -> int:
    with _client(args) as c:
        bufs = c.buffers()
    return print_listing(bufs, args.json, "buffers", lambda b, width: f"{b['name']:<{width}}  {b['dtype']:<8} "
                         f"{str(b['shape']):<16} {b['bytes']:>12} B  {b.get('device', '')}")


@_guard
def cmd_buffers_put(args) -> int:
    arr = _load_npy(args.file, f"buffer '{args.name}'")
    with _client(args) as c:
        c.put(args.name, arr)
    print(f"{args.name}: {arr.dtype}{list(arr.shape)} <- {args.file}")
    return 0


@_guard
def cmd_buffers_get(args) -> int:
    with _client(args) as c:
        arr = c.get(args.name)
    if args.file == "-":
        _print_array(args.name, arr)
    else:
        np.save(args.file, arr)
        print(f"{args.name}: {arr.dtype}{list(arr.shape)} -> {args.file}")
    return 0


@_guard
def cmd_buffers_rm(args) -> int:
    with _client(args) as c:
        for name in args.names:
            c.delete(name)
            print(f"deleted {name}")
    return 0


# ---- run --server (called by graph_cmds.cmd_run) ---------------------------------------------------
@_guard
def run_remote(args) -> int:
    """`segfuse run GRAPH --server URL`: the same inputs/outputs as the in-process run, plus
    `NAME=buffer:BUF` to read an input from, or store an output into, a server buffer."""
    from segfuse.client import Buffer, ClientError

    inputs: dict = {}
    for name, src in parse_pairs(args.input, "input").items():
        inputs[name] = Buffer(src[len(BUFFER_PREFIX):]) if src.startswith(BUFFER_PREFIX) else \
            _load_npy(src, f"input '{name}'")
    files, outputs = {}, {}
    for name, dest in parse_pairs(args.output, "output").items():
        if dest.startswith(BUFFER_PREFIX):
            outputs[name] = Buffer(dest[len(BUFFER_PREFIX):], overwrite=True)
        else:
            outputs[name], files[name] = None, dest
    graph = args.graph
    if not os.path.exists(graph) and graph.endswith(".json"):
        raise UserError(f"cannot read {graph}: no such file")
    if getattr(args, "replace", False) and not os.path.exists(graph):
        raise UserError(f"--replace registers a graph file; '{graph}' is not one (a registered name runs as it is)")
    with _client(args) as c:
        if getattr(args, "replace", False):
            graph = c.register(graph, replace=True)  # then run it by its id
        # Named outputs only when some are named: otherwise every output comes back.
        try:
            res = c.run(graph, inputs=inputs, outputs=outputs or None)
        except ClientError as e:
            if e.status == 409 and any(d.get("loc", [])[:1] == ["graph"] for d in e.details or []):
                print(f"error: {e}\nhint: --replace registers this graph in its place", file=sys.stderr)
                return 2
            raise
    for name, arr in res.outputs.items():
        if name in files:
            np.save(files[name], arr)
            print(f"{name}: {arr.dtype}{list(arr.shape)} -> {files[name]}")
        else:
            _print_array(name, arr)
    for name, buf in res.buffers.items():
        print(f"{name}: stored in buffer '{buf}'")
    t = ", ".join(f"{k} {v:.0f} us" for k, v in res.timings_us.items())
    print(f"# {res.model_name} ({res.fusion_id}): {t}; kernel cache {res.cache_hits} hits, "
          f"{res.cache_misses} misses", file=sys.stderr)
    return 0


# ---- warmup -------------------------------------------------------------------------------------
def parse_symbols(text: str) -> dict[str, int]:
    """'T=4096,K=8' -> {'T': 4096, 'K': 8}."""
    out = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        try:
            if not sep or not name:
                raise ValueError
            out[name.strip()] = int(value)
        except ValueError:
            raise UserError(f"--shape expects SYM=N[,SYM=N...], e.g. T=4096,K=8; got '{text}'") from None
    return out


def _engine(backend: str):
    """The engine `segfuse serve --backend` would use ('auto': cupy where CuPy sees a GPU, else
    numpy; the compiler's backend registry resolves it, as for the server)."""
    from segfuse.compiler.engine import Engine

    try:
        return Engine(backend)
    except ValueError as e:
        raise UserError(str(e)) from None


def cmd_warmup(args) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    envs = [parse_symbols(s) for s in args.shape] or [{}]
    # (path, fusion, its symbol names): a graph only takes the --shape values it has symbols for
    graphs = [(path, f, {str(s) for s in f.symbols}) for path, f in ((p, load_graph(p)) for p in args.graphs)]
    for path, _, symbols in graphs:
        for env in envs:
            missing = sorted(symbols - set(env))
            if missing:
                raise UserError(f"{path}: give a value for {', '.join(missing)} with --shape, "
                                f"e.g. --shape {','.join(f'{m}=1024' for m in missing)}")
    known = set().union(*(symbols for _, _, symbols in graphs))
    unknown = sorted({k for env in envs for k in env} - known)
    if unknown:  # a typo would otherwise be ignored silently
        raise UserError(f"--shape names {', '.join(unknown)}, which no graph has "
                        f"(symbols: {', '.join(sorted(known)) or 'none'})")
    engine = _engine(args.backend)
    # Backends that compile (CuPy) compile every kernel of the plan; the NumPy backend only plans.
    step = engine.warmup
    verb = "compile" if engine.compiles else "plan"
    done = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=not sys.stderr.isatty(), console=_stderr_console()) as bar:
        task = bar.add_task(f"{verb} on {engine.backend}", total=len(graphs) * len(envs))
        for _, f, symbols in graphs:
            # --shape values this graph has no symbol for would repeat the same sizes
            own = list({tuple((k, v) for k, v in env.items() if k in symbols): None for env in envs})
            bar.update(task, total=bar.tasks[0].total - (len(envs) - len(own)))
            for env in map(dict, own):
                label = ",".join(f"{k}={v}" for k, v in env.items())
                bar.update(task, description=f"{verb} {f.name} {label}".rstrip())
                t0 = time.perf_counter()
                shapes = f.input_shapes(env)
                f.bind(shapes)  # BindError (exit 2) for sizes the graph cannot take
                result = step(f, shapes)
                done.append((f.name, label, _summary(result), (time.perf_counter() - t0) * 1e3))
                bar.advance(task)
    for name, label, summary, ms in done:
        print(f"{name} {label}: {summary} ({ms:.1f} ms)".replace("  ", " "))
    why = "" if engine.compiles else f" (plan only: the {engine.backend} backend has no kernels to compile)"
    print(f"warmed up {len(done)} graph/size pair(s) on the {engine.backend} backend{why}")
    return 0


def _summary(result) -> str:
    if result is None:
        return "valid"
    if isinstance(result, dict):
        return ", ".join(f"{k} {v}" for k, v in result.items() if isinstance(v, (int, float, str)))
    segs = getattr(result, "segments", None)
    if segs is not None:
        return f"{len(segs)} segment(s), {getattr(result, 'kernel_count', len(segs))} kernel(s)"
    return str(result)


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


# ---- bench --------------------------------------------------------------------------------------
def gpu_visible() -> bool:
    """True when CuPy imports and sees at least one CUDA device (the server's own test)."""
    from segfuse.compiler.engine import backend_unavailable

    return backend_unavailable("cupy") is None


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def cmd_bench(args) -> int:
    import shutil

    script = Path(args.script) if args.script else next(
        (p for p in (Path("benchmarks/bench_gpu.py"), _repo_root() / "benchmarks" / "bench_gpu.py") if p.exists()),
        None)
    if script is None or not script.exists():
        raise UserError("no benchmark script: benchmarks/bench_gpu.py is not in this checkout "
                        "(run from the repository root, or pass --script)")
    if not gpu_visible():
        raise UserError("no CUDA GPU is visible (or CuPy is not installed): segfuse bench measures GPU "
                        "kernels and cannot run here; see benchmarks/README.md")
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    rc = _run_with_progress([sys.executable, str(script), *extra])
    results = script.parent / "out" / "bench_gpu.json"  # where bench_gpu.py writes
    if rc != 0 or not results.exists():
        print(f"error: {script} exited with {rc}" + ("" if results.exists() else f" and wrote no {results}"),
              file=sys.stderr)
        return rc or 1
    out = Path(args.out) if args.out else results.parent
    out.mkdir(parents=True, exist_ok=True)
    for name in ("bench_gpu.json", "bench_gpu.md"):
        if (results.parent / name).resolve() != (out / name).resolve() and (results.parent / name).exists():
            shutil.copyfile(results.parent / name, out / name)
    print((out / "bench_gpu.md").read_text() if (out / "bench_gpu.md").exists() else "")
    plot = plot_bench(json.loads(results.read_text()), out / "bench_gpu.png")
    print(f"wrote {out / 'bench_gpu.md'}, {out / 'bench_gpu.json'}" + (f" and {plot}" if plot else
                                                                        " (no plot: pip install matplotlib)"))
    return 0


def bench_speedups(summary: dict) -> tuple[list[str], dict[str, list[float]], list[float]]:
    """(labels, {series: speedups}, targets) from bench_gpu.json's summary ratios: Engine.run with
    int64 and with int32 ids for the MoE fusions (the other workloads have one value)."""
    nan = float("nan")
    labels, wide, narrow, targets = ["chain 2^28 f32 (vs torch.compile)"], [summary["chain_vs_compile"]], [nan], [0.95]
    for bins, target in (("256", 40.0), ("16777216", 1.0)):
        if f"scatter_{bins}_vs_eager" in summary:
            labels.append(f"scatter-add {bins} bins")
            wide.append(summary[f"scatter_{bins}_vs_eager"])
            narrow.append(nan)
            targets.append(target)
    for k, v in summary.items():
        for suffix, note in (("_int64", ""), ("_int64_deferred", ", errors='deferred'")):
            if k.startswith("moe_") and k.endswith(suffix):
                name, t = k[4: -len(suffix)].rsplit("_T", 1)
                labels.append(f"{name} T={t}{note}")
                wide.append(v)
                narrow.append(summary.get(k.replace("_int64", "_int32"), nan))
                targets.append(1.0 if t == "65536" else 3.0)
    return labels, {"Engine.run (int64 ids)": wide, "Engine.run (int32 ids)": narrow}, targets


def plot_bench(results: dict, path: Path) -> Path | None:
    """A PNG of bench_gpu.json: speedups over torch eager against the targets (log scale) when the
    run has its summary ratios, else microseconds per benchmark and implementation."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    summary = results.get("summary", {})
    if "chain_vs_compile" in summary:
        labels, series, targets = bench_speedups(summary)
        ylabel = "speedup over torch eager (x)"
    else:
        rows = [r for r in results.get("rows", []) if isinstance(r.get("us"), (int, float)) and r["us"] == r["us"]]
        if not rows:
            return None
        labels = list(dict.fromkeys(r["bench"] for r in rows))
        series = {impl: [next((r["us"] for r in rows if r["bench"] == b and r["impl"] == impl), float("nan"))
                         for b in labels] for impl in dict.fromkeys(r["impl"] for r in rows)}
        targets = None
        ylabel = "microseconds per call (lower is better)"
    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * len(labels)), 5), dpi=110)
    width = 0.8 / len(series)
    for k, (name, vals) in enumerate(series.items()):
        ax.bar([i + (k - (len(series) - 1) / 2) * width for i in range(len(labels))], vals, width, label=name)
    if targets:
        ax.scatter(range(len(labels)), targets, marker="_", s=400, color="black", label="target", zorder=3)
        ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8, rotation=40, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    meta = results.get("meta", {})
    ax.set_title(f"segfuse bench: {meta.get('gpu', '')} {meta.get('date', '')} (torch {meta.get('torch', '?')})"
                 .strip(), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _run_with_progress(cmd: list[str]) -> int:
    """Run a benchmark script under a progress bar, echoing what it prints except its tables.

    bench_gpu.py prints the table so far after each benchmark, so each table header is one
    step done; a line like '[3/12] name' sets the bar's position and total directly.
    """
    import re

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    step = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)")
    console = _stderr_console()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("benchmarks", total=None)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            m = step.match(line)
            if m:
                bar.update(task, completed=int(m[1]), total=int(m[2]), description=m[3][:60])
            elif line.startswith("| bench "):
                bar.advance(task)
            elif not line.startswith("|"):  # the final table is printed once, at the end
                bar.console.print(line, markup=False, highlight=False)
        rc = proc.wait()
    return rc
