"""CPU smoke tests of benchmarks/load.py (NumPy backend, tiny sizes) and of the py-spy summary.

They check that every section runs and reports what it measured (requests made, none failed, the
fields the README describes), never how fast anything was."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
LEVEL_FIELDS = {"client", "concurrency", "workers", "requests", "errors", "seconds", "rps", "p50_us", "p90_us",
                "p99_us", "max_us"}


def run_load(tmp_path: Path, *extra: str) -> tuple[dict, str]:
    cmd = [sys.executable, str(BENCH / "load.py"), "--quick", "--backend", "numpy", "--concurrency", "1,2",
           "--duration", "1", "--samples", "4", "--bytes-size", "64K", "--stall-size", "64K", "--out",
           str(tmp_path), *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [path] = tmp_path.glob("load-numpy-*.json")
    return json.loads(path.read_text()), p.stdout


def check_levels(levels: list[dict], client: str, concurrency: list[int]) -> None:
    assert [lv["concurrency"] for lv in levels] == concurrency
    for lv in levels:
        assert LEVEL_FIELDS <= lv.keys()
        assert lv["client"] == client
        assert lv["requests"] > 0 and lv["errors"] == 0 and lv["rps"] > 0
        assert 0 < lv["p50_us"] <= lv["p90_us"] <= lv["p99_us"] <= lv["max_us"]


def test_python_client_every_section(tmp_path):
    r, out = run_load(tmp_path, "--client", "python")
    assert r["clients"] == ["python"] and r["server"]["backend"] == "numpy"
    assert (r["tokens"], r["topk"], r["experts"]) == (256, 8, 256)
    check_levels(r["infer"], "python", [1, 2])
    check_levels(r["health"], "python", [1, 2])
    for b in r["breakdown"]:
        assert b["samples"] == 4 and b["errors"] == 0
        assert b["total_p50_us"] >= b["run_p50_us"] > 0 and b["beyond_run_p50_us"] >= 0
    assert [b["label"] for b in r["breakdown"]] == ["1 connection, nothing else running",
                                                    "next to python at 2 connections"]
    assert r["in_process"]["calls"] > 0 and r["in_process"]["p50_us"] > 0
    assert [q["what"] for q in r["ratios"]] == ["python: infer / health rate at 1 connection",
                                                "python: p50 at 1 connection / in-process p50"]
    t = r["bytes"]
    assert t["bytes"] == 64 * 1024 and t["repeat"] == 3 and t["put_gbps"] > 0 and t["get_gbps"] > 0
    st = r["stall"]
    assert st["error"] is None and st["json_puts"] >= 1 and st["json_gets"] >= 1
    assert st["idle"]["probes"] > 0 and st["busy"]["probes"] > 0
    assert st["put_body_bytes"] > 8 * 1024 and math.isfinite(st["busy"]["p99_us"])
    assert r["error_lines"] == []
    for heading in ("| key number | value |", "infer: POST", "health ceiling", "in-process Engine.run baseline",
                    "server side:", "raw bytes over loopback", "stall test:"):
        assert heading in out


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not on PATH (Debian: apt-get install wrk)")
@pytest.mark.parametrize("output", ["inline", "buffer"])
def test_wrk_client(tmp_path, output):
    """inline: infer and health levels, profiled when py-spy is here; buffer: one infer level."""
    extra = ["--client", "wrk", "--output", output]
    extra += ["--only", "infer,health"] if output == "inline" else ["--only", "infer", "--concurrency", "2"]
    py_spy = shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy")
    profile = output == "inline" and Path(py_spy).exists()
    if profile:
        extra += ["--profile", str(tmp_path / "profile")]
    r, out = run_load(tmp_path, *extra)
    assert r["clients"] == ["wrk"] and r["output"] == output and r["wrk_version"]
    plain = [lv for lv in r["infer"] if not lv.get("profiled")]
    check_levels(plain, "wrk", [1, 2] if output == "inline" else [2])
    check_levels(r["health"], "wrk", [1, 2] if output == "inline" else [])
    assert r["breakdown"] and all(b["samples"] == 4 and b["errors"] == 0 for b in r["breakdown"])
    assert r["bytes"] is None and r["stall"] is None
    assert r["error_lines"] == []
    if profile:
        check_levels([lv for lv in r["infer"] if lv.get("profiled")], "wrk", [1, 2])
        assert [p["name"] for p in r["profiles"]] == ["infer-wrk-c1", "infer-wrk-c2"]
        for p in r["profiles"]:
            s = p["summary"]
            assert s["samples"] > 0 and Path(p["raw"]).exists()
            assert [x["layer"] for x in s["layers"]][-1] == "other"
            assert sum(x["self"] for x in s["layers"]) == s["samples"]
        assert "| layer (of the working samples) | self % | inclusive % |" in out


def test_profile_summary_counts(tmp_path, monkeypatch):
    """Collapsed stacks written by hand: the shares are counted from them independently."""
    monkeypatch.syspath_prepend(str(BENCH))
    import profile_summary

    site, std, repo = "/venv/lib/python3.12/site-packages", "/usr/lib/python3.12", "/src/segfuse"
    loop = (f"thread (1): MainThread;<module> (<string>:1);main ({repo}/cli/__init__.py:9);"
            f"run ({site}/uvicorn/main.py:5);Runner.run ({std}/asyncio/runners.py:118)")
    stacks = tmp_path / "raw.txt"
    stacks.write_text("\n".join([
        f"{loop} 5",  # the loop's own (uvloop's C) time
        f"{loop};RequestResponseCycle.run_asgi ({site}/uvicorn/protocols/http/httptools_impl.py:40);"
        f"app ({site}/fastapi/routing.py:10);infer ({repo}/server/routers/infer.py:60);"
        f"BaseModel.model_validate ({site}/pydantic/main.py:700) 3",
        f"{loop};RequestResponseCycle.run_asgi ({site}/uvicorn/protocols/http/httptools_impl.py:40);"
        f"dumps ({std}/json/__init__.py:231) 2",
        "thread (2): segfuse-run_0;Thread.run (/usr/lib/python3.12/threading.py:982);"
        f"_worker ({std}/concurrent/futures/thread.py:81) 7",  # waiting for work: counted apart
        "thread (2): segfuse-run_0;Thread.run (/usr/lib/python3.12/threading.py:982);"
        f"_WorkItem.run ({std}/concurrent/futures/thread.py:58);_execute ({repo}/server/runs.py:270);"
        f"Engine.run ({repo}/compiler/engine.py:140) 4",
        "not a stack line",
    ]) + "\n")
    roots = {"segfuse.server": ("/segfuse/server/",), "segfuse.compiler": ("/segfuse/compiler/",)}
    s = profile_summary.summarize(stacks, top=3, roots=roots)
    assert s["samples"] == 14 and s["waiting"] == 7
    layers = {x["layer"]: (x["self"], x["inclusive"]) for x in s["layers"]}
    assert layers["asyncio/uvloop"] == (5, 5)  # the launcher frames below Runner.run count for nothing
    assert layers["pydantic"] == (3, 3)
    assert layers["json"] == (2, 2)
    assert layers["segfuse.compiler"] == (4, 4)  # Engine.run; the CLI frame under the loop is not counted
    assert layers["segfuse.server"] == (0, 7)  # infer (3) and _execute (4) are on the stack, never innermost
    assert layers["uvicorn/h11/httptools"] == (0, 5) and layers["fastapi"] == (0, 3)
    assert layers["other"] == (0, 0)
    assert {t["thread"]: (t["samples"], t["waiting"]) for t in s["threads"]} == {"MainThread": (10, 0),
                                                                                  "segfuse-run_0": (4, 7)}
    assert s["top"][0] == {"function": "Runner.run", "file": "asyncio/runners.py", "self": 5}
    assert s["top"][1] == {"function": "Engine.run", "file": "segfuse/compiler/engine.py", "self": 4}
    md = profile_summary.markdown(s, rate=1000, seconds=0.01)
    assert "14 samples working, 7 waiting" in md and "| pydantic | 21.4 | 21.4 |" in md


def test_wrk_report_errors_are_counted(monkeypatch):
    """What the Lua done hook prints becomes a level whose failures are counted, not timed as successes."""
    monkeypatch.syspath_prepend(str(BENCH))
    import load_wrk

    rep = {"requests": 100, "duration_us": 2_000_000, "bytes": 1000, "threads": 2, "non_2xx": 7,
           "first_bad": "429 too many runs", "socket_errors": {"connect": 0, "read": 1, "write": 0, "timeout": 2},
           "status_over_399": 7, "latency_us": {"min": 5, "mean": 9.5, "stdev": 1, "p50": 9, "p90": 12, "p99": 20,
                                                "max": 31}}
    lv = load_wrk.level_from_report(rep, 4)
    assert (lv["requests"], lv["errors"], lv["rps"]) == (93, 10, 46.5)
    assert lv["error_detail"] == "7 non-2xx (first: 429 too many runs); 1 read errors; 2 timeout errors"
    assert [load_wrk.threads_for(c, 4) for c in (1, 2, 6, 7, 32, 64)] == [1, 2, 3, 1, 4, 4]


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not on PATH (Debian: apt-get install wrk)")
def test_shards_sum_the_servers(tmp_path):
    """benchmarks/load_shards.py: each level's row sums the levels of its servers, none failed."""
    cmd = [sys.executable, str(BENCH / "load_shards.py"), "--backend", "numpy", "--servers", "1,2",
           "--connections", "2", "--duration", "1", "--tokens", "64", "--out", str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [path] = tmp_path.glob("load-shards-numpy-*.json")
    r = json.loads(path.read_text())
    [mode] = r["modes"]
    assert mode["mps"] is False
    assert [row["servers"] for row in mode["infer"]] == [1, 2] == [row["servers"] for row in mode["health"]]
    for row in mode["infer"] + mode["health"]:
        assert row["errors"] == 0 and row["requests"] > 0 and len(row["per_server_rps"]) == row["servers"]
        assert math.isclose(row["rps"], sum(row["per_server_rps"]), abs_tol=row["servers"])
    assert r["in_process"]["calls"] > 0 and "| MPS | servers | connections each |" in p.stdout


def test_profile_costs_per_request(tmp_path, monkeypatch):
    """benchmarks/profile_costs.py on hand-written stacks: each sample goes to the cost centre of its
    innermost frame that names one, per-request time is share x busy / rate."""
    monkeypatch.syspath_prepend(str(BENCH))
    import profile_costs

    site, repo = "/venv/lib/python3.12/site-packages", "/src/segfuse"
    loop = "thread (1): MainThread;Runner.run (/usr/lib/python3.12/asyncio/runners.py:118)"
    fast = f"{loop};FastLane.__call__ ({repo}/server/fastlane.py:60)"
    stacks = tmp_path / "raw.txt"
    stacks.write_text("\n".join([
        f"{loop} 2",  # the loop itself
        f"{fast};RequestResponseCycle.send ({site}/uvicorn/protocols/http/httptools_impl.py:463) 3",
        f"{fast};run ({repo}/server/runs.py:90);Engine.run_batch ({repo}/compiler/engine.py:150) 4",
        f"{fast};run ({repo}/server/runs.py:90);MutexValue.inc ({site}/prometheus_client/values.py:20) 1",
        f"{fast};run ({repo}/server/runs.py:90);__init__ (<string>:2) 2",  # no centre: its caller's
        f"{fast};infer_bytes ({repo}/server/routers/infer.py:80);"
        f"decode_request ({repo}/server/binary.py:40) 3",
        "thread (2): segfuse-run-0;Thread.run (/usr/lib/python3.12/threading.py:982) 9",  # other thread
    ]) + "\n")
    c, total = profile_costs.costs(stacks)
    assert total == 15
    assert c == {"event loop (uvloop, asyncio)": 2, "socket write (uvicorn's send)": 3,
                 "GPU launch and completion (segfuse.compiler, CuPy)": 4, "metrics and statistics": 1,
                 "run admission, pins, batching, commit (server/runs.py ...)": 2,
                 "request decoding and checks": 3}
    md = profile_costs.markdown(stacks, rps=1000, rate=1000, seconds=0.03)  # busy 15/30
    assert "busy 50%" in md and "500 us of its time per request" in md
    assert "| GPU launch and completion (segfuse.compiler, CuPy) | 26.7% | 133.3 |" in md
