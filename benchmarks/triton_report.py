"""The numbers of benchmarks/triton_side_by_side.py: which requests it measures, medians over its alternating rounds,
the ratios segfuse / Triton, server-side statistics as microseconds per request, perf_analyzer's CSV, and the
Markdown tables. Pure functions on plain dicts (no servers), so tests can feed them canned wrk output."""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass

SERVERS = ("triton", "segfuse")
NAMES = {"triton": "Triton", "segfuse": "segfuse"}
# Triton's (and segfuse's) /v2/models/{m}/stats duration fields, per request
STAT_FIELDS = ("success", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class Cell:
    """One kind of request. `servers`: who serves it; `compare_to`: the Triton cell a segfuse-only cell is set
    against (Triton has no resident buffers: its nearest request carries the same ids in the body)."""
    key: str
    label: str
    servers: tuple = SERVERS
    compare_to: str | None = None


CELLS = (
    Cell("health", "GET /v2/health/live"),
    Cell("binary_t1", "infer binary, T=1"),
    Cell("binary_t4096", "infer binary, T=4096"),
    Cell("json_t4096", "infer JSON, T=4096"),
    Cell("resident_t4096", "segfuse resident buffer, T=4096 (Triton: binary)", ("segfuse",),
         compare_to="binary_t4096"),
)
CELL_BY_KEY = {c.key: c for c in CELLS}


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def summarize(runs: list[dict]) -> dict:
    """{(server, cell, connections): medians over rounds}; each run is one wrk level (load_wrk.level_from_report's
    dict) with "server", "cell", "connections" and "round" added."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["server"], r["cell"], r["connections"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        out[key] = {"rps": _median([r["rps"] for r in rs]), "p50_us": _median([r["p50_us"] for r in rs]),
                    "p99_us": _median([r["p99_us"] for r in rs]), "errors": sum(r["errors"] for r in rs),
                    "requests": sum(r["requests"] for r in rs), "rounds": len(rs),
                    "rps_rounds": [r["rps"] for r in rs],
                    "server_us": _median_stats([r.get("server_us") for r in rs])}
    return out


def _median_stats(per_round: list[dict | None]) -> dict | None:
    rounds = [s for s in per_round if s]
    if not rounds:
        return None
    return {f: _median([s.get(f) for s in rounds]) for f in rounds[0]}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare(summary: dict, cells: list[str], connections: list[int]) -> list[dict]:
    """One row per (cell, connections): both servers' medians and segfuse / Triton for req/s, p50 and p99."""
    rows = []
    for key in cells:
        cell = CELL_BY_KEY[key]
        for c in connections:
            seg = summary.get(("segfuse", key, c))
            tri = summary.get(("triton", cell.compare_to or key, c))
            if seg is None and tri is None:
                continue
            row = {"cell": key, "label": cell.label, "connections": c, "triton": tri, "segfuse": seg}
            for m in ("rps", "p50_us", "p99_us"):
                row[f"{m}_ratio"] = ratio(seg and seg[m], tri and tri[m])
            rows.append(row)
    return rows


def stats_delta(before: dict | None, after: dict | None) -> dict | None:
    """Microseconds per request of each duration field between two GET /v2/models/{m}/stats answers (Triton's
    shape; segfuse answers the same), and the requests counted; None when either is missing or none ran."""
    if not before or not after:
        return None
    b, a = _inference_stats(before), _inference_stats(after)
    if b is None or a is None:
        return None
    n = a["success"]["count"] - b["success"]["count"]
    if n <= 0:
        return None
    out = {"requests": float(n)}
    for f in STAT_FIELDS:
        cnt = a[f]["count"] - b[f]["count"]
        out[f] = (a[f]["ns"] - b[f]["ns"]) / cnt / 1e3 if cnt > 0 else None
    return out


def _inference_stats(stats: dict) -> dict | None:
    models = stats.get("model_stats") or []
    return models[0].get("inference_stats") if models else None


def parse_perf_csv(text: str) -> list[dict]:
    """perf_analyzer's -f CSV: per concurrency, inferences/s and latencies (us), the server-side split where
    the server reported statistics."""
    rows = []
    for rec in csv.DictReader(io.StringIO(text)):
        def num(name, rec=rec):
            try:
                return float((rec.get(name) or "").strip())
            except ValueError:
                return None
        rows.append({"concurrency": int(num("Concurrency") or 0), "rps": num("Inferences/Second"),
                     "p50_us": num("p50 latency"), "p99_us": num("p99 latency"), "avg_us": num("Avg latency"),
                     "server_queue_us": num("Server Queue"), "server_compute_input_us": num("Server Compute Input"),
                     "server_compute_infer_us": num("Server Compute Infer"),
                     "server_compute_output_us": num("Server Compute Output")})
    return rows


def _n(x, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def _pair(row: dict, metric: str) -> str:
    return f"{_n(row['triton'] and row['triton'][metric])} / {_n(row['segfuse'] and row['segfuse'][metric])}"


def _errors(row: dict) -> str:
    n = sum((row[s] or {}).get("errors", 0) for s in SERVERS)
    return f" **{n} errors**" if n else ""


def main_table(rows: list[dict]) -> list[str]:
    lines = ["| request | conns | Triton req/s | segfuse req/s | segfuse / Triton | p50 Triton / segfuse (us) "
             "| p99 Triton / segfuse (us) |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['label']}{_errors(r)} | {r['connections']} | {_n(r['triton'] and r['triton']['rps'])} | "
                     f"{_n(r['segfuse'] and r['segfuse']['rps'])} | {_n(r['rps_ratio'], '.2f')} | "
                     f"{_pair(r, 'p50_us')} | {_pair(r, 'p99_us')} |")
    return lines


def stats_table(rows: list[dict]) -> list[str]:
    """Server-side microseconds per request (medians over rounds), Triton / segfuse."""
    lines = ["| request | conns | queue | compute input | compute infer | compute output | success (total) |",
             "| --- | ---: | --- | --- | --- | --- | --- |"]
    for r in rows:
        t = (r["triton"] or {}).get("server_us") if r["cell"] != "resident_t4096" else None
        s = (r["segfuse"] or {}).get("server_us")
        if not t and not s:
            continue
        cols = [f"{_n(t and t.get(f), ',.0f')} / {_n(s and s.get(f), ',.0f')}" for f in STAT_FIELDS[1:] + ("success",)]
        lines.append(f"| {r['label']} | {r['connections']} | " + " | ".join(cols) + " |")
    return lines


def perf_table(perf: dict) -> list[str]:
    """perf_analyzer's rows of both servers per protocol: {protocol: {server: [rows]}} (an older
    result's {server: [rows]} is HTTP's)."""
    if set(perf) <= set(SERVERS):
        perf = {"http": perf}
    lines = ["| perf_analyzer, binary T=4096 | concurrency | Triton infer/s | segfuse infer/s | segfuse / Triton "
             "| p50 Triton / segfuse (us) | p99 Triton / segfuse (us) |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for protocol, servers in perf.items():
        by_conc: dict[int, dict] = {}
        for server, rows in servers.items():
            for row in rows:
                by_conc.setdefault(row["concurrency"], {})[server] = row
        for c in sorted(by_conc):
            t, s = by_conc[c].get("triton"), by_conc[c].get("segfuse")
            row = {"triton": t, "segfuse": s}
            lines.append(f"| {'gRPC' if protocol == 'grpc' else 'HTTP'} | {c} | {_n(t and t['rps'])} | "
                         f"{_n(s and s['rps'])} | {_n(ratio(s and s['rps'], t and t['rps']), '.2f')} | "
                         f"{_pair(row, 'p50_us')} | {_pair(row, 'p99_us')} |")
    return lines


def _dirty(result: dict) -> str:
    n = len(result.get("tree_changes") or [])
    return f" + {n} changed files" if n else ""


def report(result: dict) -> str:
    m = result["machine"]
    lines = [f"### segfuse against Triton: {result['time']}", "",
             f"- machine: {m['cpus']} CPUs ({m['cpu_model']}), Python {m['python']}; segfuse backend "
             f"{result['segfuse_backend']} (commit {result['commit']}{_dirty(result)}); tritonserver {result['triton_version']} "
             f"(Python backend, histogram {result['triton_histogram']}); wrk {result['wrk_version']}",
             f"- {result['rounds']} alternating rounds of {result['duration_s']:g} s per cell and server; medians "
             "over rounds; E=256, K=8, int64 ids", "", *main_table(result["rows"]), "",
             "Server-side statistics (`/v2/models/moe_problem_sizes/stats` differences around each cell), us per "
             "request, Triton / segfuse:", "", *stats_table(result["rows"])]
    if result.get("perf_analyzer"):
        lines += ["", *perf_table(result["perf_analyzer"])]
    elif result.get("perf_analyzer_note"):
        lines += ["", f"perf_analyzer: {result['perf_analyzer_note']}"]
    return "\n".join(lines)
