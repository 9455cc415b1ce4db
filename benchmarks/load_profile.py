"""py-spy next to a load level: record the server process while the level runs, then summarise."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from profile_summary import markdown, summarize


def find_py_spy(path: str | None) -> str | None:
    """--py-spy PATH, else py-spy on PATH, else next to this Python (a venv's or --target's bin)."""
    if path:
        return shutil.which(path)
    found = shutil.which("py-spy")
    if found:
        return found
    near = Path(sys.executable).parent / "py-spy"
    return str(near) if near.exists() else None


def profiled(py_spy: str, pid: int, out: Path, name: str, seconds: int, rate: int, level_fn,
             native: bool = False) -> tuple[dict, dict]:
    """Runs level_fn() (a blocking load level of about `seconds`) and, from 0.5 s into it, py-spy
    for max(1, seconds - 1) s: raw collapsed stacks with thread names and full file names, no
    native frames unless `native` (C frames too: where time inside uvloop, httptools, CuPy and
    the kernel's syscalls goes). Returns (the level's result, the profile's summary or error)."""
    out.mkdir(parents=True, exist_ok=True)
    raw = out / f"{name}.txt"
    box: dict = {}
    worker = threading.Thread(target=lambda: box.update(level=level_fn()), name=f"level-{name}")
    worker.start()
    time.sleep(0.5)
    record = max(1, seconds - 1)
    cmd = [py_spy, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate), "-d", str(record),
           "--threads", "--full-filenames", "-o", str(raw)] + (["--native"] if native else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=record + 60)
        err = None if p.returncode == 0 and raw.exists() else f"py-spy status {p.returncode}: {p.stderr.strip()[-400:]}"
    except (OSError, subprocess.TimeoutExpired) as e:
        err = f"py-spy: {e}"
    worker.join()
    if err:
        return box["level"], {"name": name, "error": err, "command": " ".join(cmd)}
    s = summarize(raw)
    md = markdown(s, title=f"{name} (py-spy, server pid {pid})", rate=rate, seconds=record)
    (out / f"{name}.md").write_text(md + "\n")
    return box["level"], {"name": name, "raw": str(raw), "rate": rate, "seconds": record, "summary": s,
                          "markdown": md, "command": " ".join(cmd)}
