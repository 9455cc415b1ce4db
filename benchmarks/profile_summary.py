"""Summarise py-spy's collapsed stacks (`py-spy record --format raw`, best with -t and
--full-filenames) as markdown: the share of samples by layer of the serving stack, by thread, and
the top self-time functions.

    python benchmarks/profile_summary.py benchmarks/out/profile/infer-wrk-c1.txt [--top 15]
        [--rate 1000 --seconds 5]      # also: threads busy on average (samples / rate / seconds)

A sample's self time goes to its innermost Python frame (without --native, time in C code called
from Python counts for the Python function that called it). `inclusive` counts a sample for every
layer that has a frame on its stack above the event loop or the worker thread's dispatch (see
DISPATCH), so what only launched the server counts for nothing. py-spy leaves idle threads out (a thread waiting in
epoll or on a lock); samples whose innermost frame only waits (an executor thread between work
items, see WAITING) are counted apart, so the shares are of the samples where a thread worked.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from collections import Counter
from pathlib import Path

LAYERS = [  # (layer, path fragments), first match wins; segfuse's own roots are checked before these
    ("uvicorn/h11/httptools", ("/uvicorn/", "/h11/", "/httptools/")),
    ("asyncio/uvloop", ("/asyncio/", "/uvloop/", "/anyio/")),
    ("starlette", ("/starlette/",)),
    ("fastapi", ("/fastapi/",)),
    ("pydantic", ("/pydantic/", "/pydantic_core/")),
    ("cupy", ("/cupy/", "/cupyx/", "/cupy_backends/")),
    ("json", ("/json/", "/orjson/")),
]
# Innermost frames that wait rather than work: an executor thread between work items (its queue's
# get, or the GIL after waking up), which py-spy does not always see as idle. Counted apart.
WAITING = {("_worker", "concurrent/futures/thread.py"), ("Condition.wait", "threading.py"),
           ("Event.wait", "threading.py"), ("Thread._wait_for_tstate_lock", "threading.py"),
           ("BaseSelector.select", "selectors.py"), ("EpollSelector.select", "selectors.py"),
           ("Queue.get", "queue.py")}
# Frames that hand control to callbacks, tasks and work items: `inclusive` looks only at the frames
# above the innermost of them, so the launcher below (CLI, uvicorn.run, asyncio.run) counts for nothing.
DISPATCH = {("Runner.run", "asyncio/runners.py"), ("BaseEventLoop.run_until_complete", "asyncio/base_events.py"),
            ("BaseEventLoop.run_forever", "asyncio/base_events.py"), ("BaseEventLoop._run_once", "asyncio/base_events.py"),
            ("Handle._run", "asyncio/events.py"), ("_WorkItem.run", "concurrent/futures/thread.py"),
            ("Thread.run", "threading.py")}
ORDER = ["uvicorn/h11/httptools", "asyncio/uvloop", "starlette", "fastapi", "pydantic", "segfuse.server",
         "segfuse.compiler", "cupy", "json", "other"]
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_THREAD = re.compile(r"^thread \((?P<tid>[^)]*)\)(?:: (?P<name>.*))?$")


def segfuse_roots() -> dict[str, tuple[str, ...]]:
    """Where segfuse.server and segfuse.compiler live here (an editable install maps them to the
    repository's server/ and compiler/), plus the installed layout."""
    roots = {}
    for layer in ("segfuse.server", "segfuse.compiler"):
        frags = ["/" + layer.replace(".", "/") + "/"]
        try:
            spec = importlib.util.find_spec(layer)
        except ImportError:
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec else []:
            frags.append(str(loc).rstrip("/") + "/")
        roots[layer] = tuple(frags)
    return roots


def layer_of(path: str, roots: dict[str, tuple[str, ...]]) -> str:
    for layer, frags in [*roots.items(), *LAYERS]:
        if any(f in path for f in frags):
            return layer
    return "other"


def parse_frame(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame)
    return (m["func"], m["file"]) if m else (frame, "")


def read_stacks(path: str | Path):
    """Yields (thread name, [(func, file), ...] outermost first, count) per line."""
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = "?"
        m = _THREAD.match(frames[0])
        if m:
            thread = m["name"] or m["tid"]
            frames = frames[1:]
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        yield thread, [parse_frame(f) for f in frames], int(count)


def summarize(path: str | Path, top: int = 15, roots: dict | None = None) -> dict:
    roots = roots if roots is not None else segfuse_roots()
    self_layer, incl_layer, threads, funcs, waiting = Counter(), Counter(), Counter(), Counter(), Counter()
    total = 0
    for thread, frames, n in read_stacks(path):
        if not frames:
            continue
        if is_waiting(*frames[-1]):
            waiting[thread] += n
            continue
        total += n
        threads[thread] += n
        start = max((i + 1 for i, f in enumerate(frames) if _matches(f, DISPATCH)), default=0)
        own = layer_of(frames[-1][1], roots)
        self_layer[own] += n
        for layer in {own, *(layer_of(file, roots) for _, file in frames[start:])}:
            incl_layer[layer] += n
        func, file = frames[-1]
        funcs[(func, short_path(file, roots))] += n
    return {"file": str(path), "samples": total, "waiting": sum(waiting.values()),
            "layers": [{"layer": k, "self": self_layer[k], "inclusive": incl_layer[k]} for k in ORDER],
            "threads": [{"thread": k, "samples": threads[k], "waiting": waiting[k]}
                        for k, _ in (threads + waiting).most_common()],
            "top": [{"function": f, "file": p, "self": v} for (f, p), v in funcs.most_common(top)]}


def _matches(frame: tuple[str, str], table: set) -> bool:
    func, file = frame
    return any(func == f and file.endswith("/" + suffix) for f, suffix in table)


def is_waiting(func: str, file: str) -> bool:
    return _matches((func, file), WAITING)


def short_path(path: str, roots: dict) -> str:
    for layer, frags in roots.items():
        for f in frags:
            if f in path:
                return layer.replace(".", "/") + "/" + path.split(f, 1)[1]
    for mark in ("site-packages/", "dist-packages/"):
        if mark in path:
            return path.split(mark, 1)[1]
    m = re.search(r"/lib/python3\.\d+/(.*)$", path)
    return m[1] if m else path


def markdown(s: dict, title: str | None = None, rate: float | None = None, seconds: float | None = None) -> str:
    total = s["samples"] or 1
    head = f"{title or s['file']}: {s['samples']} samples working, {s['waiting']} waiting"
    if rate and seconds:
        head += f" at {rate:g} Hz over {seconds:g} s ({s['samples'] / rate / seconds:.2f} threads working on average)"
    lines = [f"**{head}**", "", "| layer (of the working samples) | self % | inclusive % |", "|---|---:|---:|"]
    lines += [f"| {x['layer']} | {100 * x['self'] / total:.1f} | {100 * x['inclusive'] / total:.1f} |"
              for x in s["layers"]]
    timed = bool(rate and seconds)
    lines += ["", "| thread | working % | waiting samples |" + (" working (threads) |" if timed else ""),
              "|---|---:|---:|" + ("---:|" if timed else "")]
    for t in s["threads"]:
        busy = f" {t['samples'] / rate / seconds:.2f} |" if timed else ""
        lines.append(f"| {t['thread']} | {100 * t['samples'] / total:.1f} | {t['waiting']} |{busy}")
    lines += ["", f"| top {len(s['top'])} self-time functions | file | self % |", "|---|---|---:|"]
    lines += [f"| `{t['function']}` | {t['file']} | {100 * t['self'] / total:.1f} |" for t in s["top"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="py-spy raw (collapsed) stack files")
    p.add_argument("--top", type=int, default=15, help="self-time functions to list (default 15)")
    p.add_argument("--rate", type=float, help="the sampling rate given to py-spy (Hz)")
    p.add_argument("--seconds", type=float, help="the duration given to py-spy")
    args = p.parse_args(argv)
    for f in args.files:
        print(markdown(summarize(f, args.top), rate=args.rate, seconds=args.seconds))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
