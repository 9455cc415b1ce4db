"""segfuse against a real Triton Inference Server 2.51.0, side by side: the same tritonclient.http calls (and raw
requests for what the client cannot express) on both, serving the same MoE histogram as `moe_problem_sizes`,
comparing status codes, body shapes and what the client does; answers are checked against NumPy on both.

Every difference observed must be a row of the table "Differences from Triton" in docs/http-api.md, with the
cells rendered by helpers/conformance.py, and every row must still be observed. Triton comes from PyPI
(benchmarks/triton_setup.sh, once, into ~/.cache/segfuse/triton-2.51.0 or SEGFUSE_TRITON_DIR). Skipped only where
its wheel cannot run: not Linux x86-64, glibc older than 2.35, or PyPI unreachable (under CI=true that fails)."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from helpers import triton_cases, triton_cases_admin, triton_cases_grpc
from helpers.conformance import SECTION, differences, documented, row_text
from helpers.triton_install import (
    MARKER,
    InstallError,
    ensure_layout,
    index_problem,
    is_complete,
    platform_problem,
)
from helpers.triton_pair import SERVERS, perf_analyzer, server_pair
from helpers.triton_probe import ids_of

# One list of cases, each run against both servers, over HTTP and over gRPC
CASES = triton_cases.CASES + triton_cases_admin.CASES + triton_cases_grpc.CASES
CASE_IDS = [c.id for c in CASES]


@pytest.fixture(scope="session")
def triton_layout():
    problem = platform_problem()
    if problem:
        pytest.skip(problem)
    try:
        return ensure_layout()
    except InstallError:
        under_ci = os.environ.get("CI", "").lower() in ("true", "1", "yes")
        unreachable = None if under_ci else index_problem()
        if unreachable:
            pytest.skip(f"Triton's wheels cannot be installed: {unreachable}")
        raise


@pytest.fixture(scope="session")
def servers(triton_layout, tmp_path_factory):
    with server_pair(triton_layout, tmp_path_factory.mktemp("triton_pair")) as pair:
        yield pair


@pytest.fixture(scope="module")
def table() -> dict:
    return documented()


def test_cases_have_distinct_ids():
    assert len(set(CASE_IDS)) == len(CASE_IDS)
    assert all("`" not in i and "|" not in i for i in CASE_IDS)


def test_a_difference_shows_only_what_differs():
    triton = {"status": 400, "body": frozenset({"error: str"}), "client": "raises 400"}
    segfuse = {"status": 400, "body": frozenset({"error: str", "details[].loc[]: str"}), "client": "raises 404"}
    assert differences(triton, segfuse) == ("`body: (nothing more)` `client: raises 400`",
                                            "`body: +details[].loc[]: str` `client: raises 404`")
    assert differences(triton, dict(triton)) is None
    assert differences({"body": "empty"}, {"body": frozenset({"live: bool"})}) == ("`body: empty`",
                                                                                   "`body: {live: bool}`")


def test_the_table_is_read_by_case():
    text = ("# t\n\n" + SECTION + "\n\nSome words.\n\n| case | Triton 2.51 | segfuse | why |\n| --- | --- | --- | --- |\n"
            "| `infer: bad JSON` | `status: 500` | `status: 400` | a reason |\n\n## Next\n\n| a | b |\n| - | - |\n")
    rows = documented(text)
    assert list(rows) == ["infer: bad JSON"]
    assert (rows["infer: bad JSON"].triton, rows["infer: bad JSON"].segfuse) == ("`status: 500`", "`status: 400`")
    with pytest.raises(ValueError, match="two rows"):
        documented(text.replace("\n\n## Next", "\n| `infer: bad JSON` | x | y | z |\n\n## Next"))


def test_a_layout_counts_only_with_its_marker(tmp_path):
    """A half-finished install (no marker) or one by another version of triton_setup.sh is not reused."""
    (tmp_path / "env.sh").write_text("export TRITON_DIST=x\n")
    assert not is_complete(tmp_path)
    (tmp_path / MARKER).write_text("0" * 64 + "\n")
    assert not is_complete(tmp_path)


def test_every_documented_difference_names_a_case(table):
    assert table, f"docs/http-api.md has no table under {SECTION!r}"
    assert sorted(set(table) - set(CASE_IDS)) == []
    assert all(row.why.strip() for row in table.values()), "every row says why"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_segfuse_answers_as_triton_or_as_documented(case, servers, table):
    seen = {kind: case.probe(servers[kind]) for kind in SERVERS}
    diff = differences(seen["triton"], seen["segfuse"])
    row = table.get(case.id)
    if diff is None:
        assert row is None, f"the row for {case.id!r} is stale: both servers now answer {seen['segfuse']}"
        return
    assert row is not None, (f"an undocumented difference; fix it or add to docs/http-api.md:\n"
                             f"{row_text(case.id, diff)}")
    assert (row.triton, row.segfuse) == diff, f"the row for {case.id!r} no longer matches:\n{row_text(case.id, diff)}"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_runs_against_both(protocol, servers, triton_layout, tmp_path):
    """perf_analyzer of the tritonclient 2.51.0 wheel, unchanged, at concurrency 1 over HTTP and over gRPC
    (`-i grpc`): it completes on both, and its server-side statistics (read from the statistics extension) show for
    segfuse too."""
    binary, env = perf_analyzer(triton_layout)
    ids = ids_of(8, tokens=64)
    data = tmp_path / "input.json"
    data.write_text(json.dumps({"data": [{"topk_ids": {"content": ids.reshape(-1).tolist(),
                                                       "shape": list(ids.shape)}}]}))
    out = {}
    for kind in SERVERS:
        t = servers[kind]
        address = t.grpc_address if protocol == "grpc" else t.address
        p = subprocess.run([binary, "-m", t.model, "-u", address, "-i", protocol, "-b", "1", "--input-data",
                            str(data), "--concurrency-range", "1:1", "--measurement-interval", "700",
                            "--stability-percentage", "999", "--max-trials", "5"],
                           env=env, capture_output=True, text=True, timeout=180)
        out[kind] = p.stdout + p.stderr
        assert p.returncode == 0, f"perf_analyzer -i {protocol} against {kind} exited {p.returncode}:\n{out[kind][-3000:]}"
    for kind in SERVERS:
        server = re.search(r"Server:\s*\n\s*Inference count: (\d+)\s*\n\s*Execution count: (\d+)\s*\n\s*"
                           r"Successful request count: (\d+)\s*\n\s*Avg request latency: ", out[kind])
        assert server and min(int(n) for n in server.groups()) > 0, f"{kind}:\n{out[kind][-3000:]}"
        assert "Concurrency: 1, throughput:" in out[kind], out[kind][-3000:]
