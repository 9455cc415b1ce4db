"""CPU smoke test of benchmarks/bench_regions.py: the NumPy backend (system shared-memory regions),
--quick sizes. It checks that every section ran and that the benchmark's own checks against NumPy
passed, never how fast anything was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ["region", "buffer", "inline"]


def test_quick_numpy_run(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_regions.py"), "--backend", "numpy", "--quick",
           "--out", str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [path] = tmp_path.glob("bench_regions-numpy-*.json")
    r = json.loads(path.read_text())
    assert r["backend"] == "numpy" and r["region_kind"] == "system" and r["server"]["backend"] == "numpy"
    assert (r["tokens"], r["topk"], r["experts"]) == (256, 8, 256)
    assert r["errors"] == [] and r["failures"] == []
    assert r["machine"]["cpus"] >= 1 and r["commit"] and r["time"]
    for section in ("sequential", "concurrent"):
        rows = r[section]
        assert [(x["fusion"], x["mode"]) for x in rows] == [(f, m) for f in ("histogram", "argsort") for m in MODES]
        for x in rows:
            assert x["check"] == "ok", x
            assert x["calls"] > 0 and x["runs_per_s"] > 0
            assert 0 < x["p50_us"] <= x["p90_us"] <= x["p99_us"]
    assert all(x["calls"] == r["calls"] and x["server_run_p50_us"] > 0 for x in r["sequential"])
    assert all(x["threads"] == r["threads"] == 2 and x["errors"] == [] for x in r["concurrent"])
    assert [x["way"] for x in r["big"]] == ["region", "upload", "inline"]
    for x in r["big"]:
        assert x["check"] == "ok" and x["bytes"] == 4 << 20 and x["tokens"] == (4 << 20) // 64
        assert x["reps"] == 2 and x["p50_s"] > 0 and x["gbps"] > 0
    assert r["big"][0]["register_s"] > 0 and r["big"][1]["put_p50_s"] > 0
    assert "| histogram | region |" in p.stdout and "| argsort | inline |" in p.stdout
