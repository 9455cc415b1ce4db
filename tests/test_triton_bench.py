"""benchmarks/triton_side_by_side.py without Triton or a server: the request bodies it sends to both servers,
how it reads their answers, its medians and ratios over rounds of canned wrk output, the server statistics per
request, perf_analyzer's CSV, and its arguments. Never timing."""

from __future__ import annotations

import json

import httpx
import load_wrk
import numpy as np
import pytest
import triton_report
import triton_side_by_side as tsbs


def wrk_report(requests: int, seconds: float, p50: int, p99: int, non_2xx: int = 0) -> dict:
    """The JSON line benchmarks/wrk/report.lua prints."""
    return {"requests": requests, "duration_us": int(seconds * 1e6), "bytes": 0, "threads": 1, "non_2xx": non_2xx,
            "first_bad": "500 boom" if non_2xx else None,
            "socket_errors": {"connect": 0, "read": 0, "write": 0, "timeout": 0}, "status_over_399": non_2xx,
            "latency_us": {"min": 1, "mean": p50, "stdev": 1, "p50": p50, "p90": p99, "p99": p99, "max": p99}}


def run(server: str, cell: str, conns: int, rnd: int, requests: int, p50: int, p99: int, non_2xx: int = 0) -> dict:
    level = load_wrk.level_from_report(wrk_report(requests, 5.0, p50, p99, non_2xx), conns)
    return {**level, "server": server, "cell": cell, "connections": conns, "round": rnd, "server_us": None}


def test_rows_take_medians_over_rounds_and_divide_segfuse_by_triton():
    runs = [run("triton", "binary_t4096", 1, 0, 10_000, 500, 900), run("segfuse", "binary_t4096", 1, 0, 5_000, 1000, 2000),
            run("triton", "binary_t4096", 1, 1, 12_000, 400, 700), run("segfuse", "binary_t4096", 1, 1, 7_000, 800, 1600),
            run("triton", "binary_t4096", 1, 2, 11_000, 450, 800), run("segfuse", "binary_t4096", 1, 2, 3_000, 900, 1800),
            run("segfuse", "resident_t4096", 1, 0, 11_000, 300, 600, non_2xx=10)]
    summary = triton_report.summarize(runs)
    tri = summary[("triton", "binary_t4096", 1)]
    assert (tri["rps"], tri["p50_us"], tri["p99_us"], tri["rounds"]) == (2200.0, 450.0, 800.0, 3)
    seg = summary[("segfuse", "binary_t4096", 1)]
    assert (seg["rps"], seg["p50_us"], seg["p99_us"]) == (1000.0, 900.0, 1800.0)

    rows = triton_report.compare(summary, ["binary_t4096", "resident_t4096", "json_t4096"], [1, 8])
    assert [(r["cell"], r["connections"]) for r in rows] == [("binary_t4096", 1), ("resident_t4096", 1)]
    binary, resident = rows
    assert binary["rps_ratio"] == pytest.approx(1000 / 2200)
    assert binary["p50_us_ratio"] == pytest.approx(2.0) and binary["p99_us_ratio"] == pytest.approx(2.25)
    # Triton has no resident buffers: that row sets segfuse against Triton's binary request of the same ids
    assert resident["triton"] is tri
    assert resident["segfuse"]["rps"] == pytest.approx((11_000 - 10) / 5) and resident["segfuse"]["errors"] == 10
    assert resident["rps_ratio"] == pytest.approx(2198 / 2200)

    table = triton_report.main_table(rows)
    assert table[2] == "| infer binary, T=4096 | 1 | 2,200 | 1,000 | 0.45 | 450 / 900 | 800 / 1,800 |"
    assert "**10 errors**" in table[3]


def test_a_cell_only_one_server_answered_shows_dashes():
    rows = triton_report.compare(triton_report.summarize([run("triton", "health", 8, 0, 50_000, 90, 300)]),
                                 ["health"], [8])
    assert rows[0]["rps_ratio"] is None
    assert triton_report.main_table(rows)[2] == "| GET /v2/health/live | 8 | 10,000 | - | - | 90 / - | 300 / - |"


def stats(success, queue, infer, output, count):
    """GET /v2/models/{m}/stats in Triton's shape, `count` requests with these total nanoseconds."""
    def d(ns):
        return {"count": count, "ns": ns}
    return {"model_stats": [{"name": "moe_problem_sizes", "version": "1", "inference_stats": {
        "success": d(success), "fail": d(0), "queue": d(queue), "compute_input": d(count * 1000),
        "compute_infer": d(infer), "compute_output": d(output), "cache_hit": d(0), "cache_miss": d(0)}}]}


def test_server_statistics_become_microseconds_per_request_between_two_answers():
    before = stats(success=5_000_000, queue=1_000_000, infer=2_000_000, output=500_000, count=10)
    after = stats(success=45_000_000, queue=3_000_000, infer=22_000_000, output=4_500_000, count=50)
    got = triton_report.stats_delta(before, after)
    assert got == {"requests": 40.0, "success": 1000.0, "queue": 50.0, "compute_input": 1.0, "compute_infer": 500.0,
                   "compute_output": 100.0}
    assert triton_report.stats_delta(before, before) is None  # no request in between
    assert triton_report.stats_delta(None, after) is None
    assert triton_report.stats_delta({"error": "unknown model"}, after) is None


PERF_CSV = """Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,\
Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,Avg latency,\
request/response,response wait
8,2121.5,20,3000,1100,21,311,22,5,3294,4000,4500,6100,3700,2121,3600
"""


def test_perf_analyzer_csv_rows():
    [row] = triton_report.parse_perf_csv(PERF_CSV)
    assert row == {"concurrency": 8, "rps": 2121.5, "p50_us": 3294.0, "p99_us": 6100.0, "avg_us": 3700.0,
                   "server_queue_us": 1100.0, "server_compute_input_us": 21.0, "server_compute_infer_us": 311.0,
                   "server_compute_output_us": 22.0}
    table = triton_report.perf_table({"triton": [row], "segfuse": [{**row, "rps": 1060.75, "p50_us": 6588.0}]})
    assert table[2] == "| HTTP | 8 | 2,122 | 1,061 | 0.50 | 3,294 / 6,588 | 6,100 / 6,100 |"  # (an older result)
    table = triton_report.perf_table({"http": {"triton": [row], "segfuse": [row]},
                                      "grpc": {"triton": [{**row, "rps": 1000.0}], "segfuse": [{**row, "rps": 500.0}]}})
    assert table[2:] == ["| HTTP | 8 | 2,122 | 2,122 | 1.00 | 3,294 / 3,294 | 6,100 / 6,100 |",
                         "| gRPC | 8 | 1,000 | 500 | 0.50 | 3,294 / 3,294 | 6,100 / 6,100 |"]


def test_bodies_carry_the_ids_in_both_encodings(tmp_path):
    ids = np.random.default_rng(1).integers(0, 256, (5, 8), dtype=np.int64)
    one = ids[:1]
    bodies = tsbs.request_bodies(one, ids, tmp_path)
    for key, want in (("binary_t1", one), ("binary_t4096", ids)):
        path, ctype, header = bodies[key]
        raw = path.read_bytes()
        head = json.loads(raw[:int(header)])
        [inp] = head["inputs"]
        assert ctype == "application/octet-stream" and inp["shape"] == list(want.shape)
        assert inp["parameters"]["binary_data_size"] == want.nbytes == len(raw) - int(header)
        assert np.array_equal(np.frombuffer(raw[int(header):], np.int64).reshape(want.shape), want)
        assert head["outputs"] == [{"name": "counts", "parameters": {"binary_data": True}}]
    path, ctype, header = bodies["json_t4096"]
    [inp] = json.loads(path.read_bytes())["inputs"]
    assert (ctype, header, inp["datatype"]) == ("application/json", "", "INT64")
    assert np.array_equal(np.asarray(inp["data"]).reshape(inp["shape"]), ids)


def test_counts_are_read_from_json_and_binary_answers():
    counts = np.arange(256, dtype=np.int64)
    req = httpx.Request("POST", "http://x/v2/models/m/infer")
    as_json = httpx.Response(200, json={"outputs": [{"name": "counts", "data": counts.tolist()}]}, request=req)
    assert np.array_equal(tsbs.response_counts(as_json), counts)
    head = json.dumps({"outputs": [{"name": "counts", "parameters": {"binary_data_size": 2048}}]}).encode()
    binary = httpx.Response(200, content=head + counts.tobytes(), request=req,
                            headers={"inference-header-content-length": str(len(head))})
    assert np.array_equal(tsbs.response_counts(binary), counts)
    with pytest.raises(httpx.HTTPStatusError):
        tsbs.response_counts(httpx.Response(400, json={"error": "bad"}, request=req))


def test_arguments():
    args = tsbs.parse_args([])
    assert (args.segfuse_backend, args.connections, args.pa_concurrency, args.rounds) == ("numpy", [1, 8, 32], [1, 8], 2)
    assert args.cells == [c.key for c in triton_report.CELLS]
    assert args.out.name == "triton_side_by_side-numpy.json" and args.out.parent.name == "results"
    args = tsbs.parse_args(["--segfuse-backend", "cupy", "--connections", "32,1,8,1", "--pa-concurrency", "",
                            "--cells", "health,resident_t4096"])
    assert (args.connections, args.pa_concurrency, args.cells) == ([1, 8, 32], [], ["health", "resident_t4096"])
    assert args.out.name == "triton_side_by_side-cupy.json"
    for bad in (["--cells", "health,nope"], ["--connections", "0"], ["--connections", "a"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            tsbs.parse_args(bad)
