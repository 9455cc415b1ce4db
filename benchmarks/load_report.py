"""Markdown tables of one load benchmark result (the dict load.py writes as JSON)."""

from __future__ import annotations

import json
import time
from pathlib import Path


def save(result: dict, out: str, stem: str) -> Path:
    """Writes the result as out/<stem>-<time>.json and prints where."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {path}")
    return path


def _f(x, fmt: str = ".0f") -> str:
    return "n/a" if x is None or x != x else format(x, fmt)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB"


def header(r: dict) -> list[str]:
    m, v, s = r["machine"], r["versions"], r["server"]
    http = f"http {r['server_stack']['http']}, loop {r['server_stack']['loop']}"
    libs = ", ".join(f"{k} {v[k]}" for k in ("fastapi", "starlette", "uvicorn", "pydantic", "numpy", "cupy")
                     if v.get(k))
    return [f"### Load benchmark of the REST service: {r['time']}",
            "",
            f"- fusion: moe_problem_sizes, T={r['tokens']} K={r['topk']} E={r['experts']}, int64 ids in the resident "
            f"buffer `bench_ids`, output {r['output']}",
            f"- server: backend {s['backend']} on {s['device']}, segfuse {s.get('version', '?')} (commit "
            f"{r['commit']}), {http}",
            f"- machine: {m['host']}, {m['cpus']} CPUs ({m['cpu_model']}), {m['platform']}",
            f"- versions: Python {m['python']}, {libs}" + (f", wrk {r['wrk_version']}" if r.get("wrk_version") else ""),
            f"- {r['duration_s']:g} s per level; loopback only"]


def level_table(levels: list[dict], rate_col: bool) -> list[str]:
    cols = "| client | conns | threads/procs | requests | errors | req/s |" + (" vs 1 conn |" if rate_col else "")
    lines = [cols + " p50 us | p90 us | p99 us | max us |",
             "|---|---:|---:|---:|---:|---:|" + ("---:|" if rate_col else "") + "---:|---:|---:|---:|"]
    first = {}
    for lv in levels:
        first.setdefault(lv["client"], lv["rps"])
        vs = f" {lv['rps'] / first[lv['client']]:.2f}x |" if rate_col and first[lv["client"]] else (" n/a |" if rate_col else "")
        err = f"**{lv['errors']}**" if lv["errors"] else "0"
        lines.append(f"| {lv['client']}{' (profiled)' if lv.get('profiled') else ''} | {lv['concurrency']} | "
                     f"{lv['workers']} | {lv['requests']} | {err} | {lv['rps']:.0f} |{vs} {_f(lv['p50_us'])} | "
                     f"{_f(lv['p90_us'])} | {_f(lv['p99_us'])} | {_f(lv['max_us'])} |")
    return lines


def breakdown_table(rows: list[dict]) -> list[str]:
    lines = ["| sampled | n | total | run | queue | plan | total - run p50 | total - run p99 | client round trip "
             "| round trip - total |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b in rows:
        lines.append(f"| {b['label']} | {b['samples']} | {_f(b['total_p50_us'])} | {_f(b['run_p50_us'])} | "
                     f"{_f(b['queue_p50_us'])} | {_f(b['plan_p50_us'])} | {_f(b['beyond_run_p50_us'])} | "
                     f"{_f(b['beyond_run_p99_us'])} | {_f(b['round_trip_p50_us'])} | {_f(b['outside_total_p50_us'])} |")
    return lines


def key_numbers(r: dict) -> list[str]:
    rows = []
    infer = r.get("infer", [])
    for client in dict.fromkeys(lv["client"] for lv in infer):
        mine = [lv for lv in infer if lv["client"] == client and not lv.get("profiled")]
        one = next((lv for lv in mine if lv["concurrency"] == 1), None)
        if one:
            rows.append((f"{client}: 1-connection p50 round trip", f"{one['p50_us']:.0f} us"))
        at32 = next((lv for lv in mine if lv["concurrency"] == 32), None) or (mine[-1] if mine else None)
        if at32:
            rows.append((f"{client}: runs/s at {at32['concurrency']} connection{'s' if at32['concurrency'] != 1 else ''} (p99)",
                         f"{at32['rps']:.0f}/s (p99 {at32['p99_us']:.0f} us)"))
        if len(mine) > 1:
            rates = " -> ".join(f"{lv['rps']:.0f}" for lv in mine)
            rows.append((f"{client}: req/s by level ({', '.join(str(lv['concurrency']) for lv in mine)})", rates))
    for q in r.get("ratios", []):
        rows.append((q["what"], q["value"]))
    for b in r.get("breakdown", [])[:1]:
        rows.append(("server time beyond Engine.run (total - run, p50 / p99)",
                     f"{_f(b['beyond_run_p50_us'])} / {_f(b['beyond_run_p99_us'])} us"))
    if r.get("bytes"):
        t = r["bytes"]
        rows.append((f"{_mib(t['bytes'])} raw PUT / GET over loopback", f"{t['put_gbps']:.2f} / {t['get_gbps']:.2f} GB/s"))
    if r.get("stall"):
        st = r["stall"]
        rows.append((f"/v2/health/live p99 while {_mib(st['buffer_bytes'])} JSON bodies go through",
                     f"{_f(st['busy']['p99_us'])} us, max {_f(st['busy']['max_us'])} us "
                     f"(idle: {_f(st['idle']['p99_us'])} us)"))
    return ["| key number | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]


def table(r: dict) -> str:
    lines = header(r)
    errs = r.get("error_lines", [])
    if errs:
        lines += ["", "**ERRORS in this run (numbers below are not valid where marked):**",
                  *(f"- **{e}**" for e in errs)]
    lines += ["", *key_numbers(r)]
    if r.get("infer"):
        lines += ["", "infer: POST /v2/models/{id}/infer on the resident buffer (latencies from the client)", "",
                  *level_table(r["infer"], True)]
    if r.get("health"):
        lines += ["", "health ceiling: GET /v2/health/live, same server", "", *level_table(r["health"], False)]
    base = r.get("in_process")
    if base:
        lines += ["", f"in-process Engine.run baseline (same fusion and backend, this process, after the server "
                      f"stopped): p50 {base['p50_us']:.0f} us, p99 {base['p99_us']:.0f} us over {base['calls']} calls"]
    if r.get("breakdown"):
        lines += ["", "server side: medians of the responses' parameters.timings_us (us); total = admission "
                      "to outputs bound, so it leaves out parsing the request and encoding the response", "",
                  *breakdown_table(r["breakdown"])]
    if r.get("bytes"):
        t = r["bytes"]
        lines += ["", f"raw bytes over loopback: one int64 buffer of {_mib(t['bytes'])}, median of {t['repeat']}", "",
                  "| transfer | median s | GB/s |", "|---|---:|---:|",
                  f"| PUT application/octet-stream | {t['put_median_s']:.4f} | {t['put_gbps']:.2f} |",
                  f"| GET application/octet-stream | {t['get_median_s']:.4f} | {t['get_gbps']:.2f} |"]
    if r.get("stall"):
        st = r["stall"]
        busy = (f"JSON PUT+GET of {_mib(st['buffer_bytes'])} int64 ({st['put_body_bytes'] / 1e6:.1f} MB bodies): "
                f"{st['json_puts']} PUTs (median {_f(st['json_put_median_s'], '.2f')} s), {st['json_gets']} GETs "
                f"(median {_f(st['json_get_median_s'], '.2f')} s)")
        lines += ["", f"stall test: GET /v2/health/live every {st['idle']['interval_ms']:g} ms, latency from when "
                      "each probe was due (us)", "",
                  "| while | probes | p50 | p99 | max | round trip p99 |", "|---|---:|---:|---:|---:|---:|"]
        for label, ph in (("idle", st["idle"]), (busy, st["busy"])):
            lines.append(f"| {label} | {ph['probes']} | {_f(ph['p50_us'])} | {_f(ph['p99_us'])} | {_f(ph['max_us'])} | "
                         f"{_f(ph['rtt_p99_us'])} |")
    for p in r.get("profiles", []):
        lines += ["", p.get("markdown") or f"**profile {p['name']}: {p['error']}**"]
    return "\n".join(lines)
