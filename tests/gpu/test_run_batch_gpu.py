"""`Engine("cupy").run_batch` on the GPU: runs launched back to back with one wait; a run with a bad
index fails alone with its own RunError, every other run's outputs equal NumPy's; batches on the
fast path (graph replays included) and in-place runs inside a batch; the GPU stays usable."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from corpus import moe_graphs  # noqa: E402
from helpers.graphs import SCATTER_ADD_INPLACE as INPLACE  # noqa: E402
from segfuse.compiler.engine import Engine, RunResult  # noqa: E402
from segfuse.compiler.errors import DeferredRunError, RunError  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402
from segfuse.compiler.numpy_backend import run_graph  # noqa: E402

pytestmark = pytest.mark.gpu

def _check(results, hosts, fusions, bad):
    for k, (res, host, f) in enumerate(zip(results, hosts, fusions)):
        if k in bad:
            assert type(res) is RunError, (k, res)
            assert "out of bounds" in str(res)
            continue
        assert isinstance(res, RunResult), (k, res)
        want = run_graph(f, host)
        for name, v in want.items():
            np.testing.assert_array_equal(cp.asnumpy(res.outputs[name]), v, err_msg=f"run {k} {name}")


@pytest.mark.parametrize("T", [1, 128, 4096, 65536])
@pytest.mark.parametrize("idt", ["int64", "int32"])
def test_batches_of_the_four_moe_fusions_with_bad_runs(T, idt):
    graphs = moe_graphs(idt=idt)
    eng = Engine("cupy")
    for rnd in range(3):  # the first round prepares, later ones take the fast path (and graphs)
        calls, hosts, fusions, bad = [], [], [], set()
        for k in range(12):
            g, mk = graphs[k % 4]
            f = Fusion.from_json(g)
            host = mk(T)(np.random.default_rng(100 * rnd + k))
            if k % 4 == 0 and k in (4, 8) and rnd > 0:
                host["topk_ids"].reshape(-1)[T // 2] = 256 + k  # out of range for E = 256
                bad.add(k)
            hosts.append(host)
            fusions.append(f)
            calls.append((f, {n: cp.asarray(v) for n, v in host.items()}))
        _check(eng.run_batch(calls), hosts, fusions, bad)
    eng.synchronize()  # nothing left over: no deferred failure leaks out of a batch


def test_replayed_graphs_in_a_batch_report_their_own_failure():
    """The same buffers in batch after batch: the histogram's launches are captured and replayed;
    a bad id written into the captured buffer fails that batch's replay alone."""
    graphs = moe_graphs()
    f = Fusion.from_json(graphs[0][0])
    f_bs = Fusion.from_json(graphs[2][0])  # another fusion in each batch (its own prepared call)
    eng = Engine("cupy")
    ids = cp.asarray(graphs[0][1](4096)(np.random.default_rng(0))["topk_ids"])
    counts_host = graphs[2][1](4096)(np.random.default_rng(1))
    counts = cp.asarray(counts_host["tokens_per_expert"])
    for rnd in range(6):
        bad = rnd == 4
        if bad:
            ids[7, 3] = -3
        elif rnd == 5:
            ids[7, 3] = 0
        out = eng.run_batch([(f_bs, {"tokens_per_expert": counts}), (f, {"topk_ids": ids})])
        assert isinstance(out[0], RunResult)
        want = run_graph(f_bs, counts_host)
        for name, v in want.items():
            np.testing.assert_array_equal(cp.asnumpy(out[0].outputs[name]), v)
        if bad:
            assert type(out[1]) is RunError and "index -3" in str(out[1])
        else:
            np.testing.assert_array_equal(cp.asnumpy(out[1].outputs["counts"]),
                                          run_graph(f, {"topk_ids": cp.asnumpy(ids)})["counts"])
        del out  # outputs released: the next batch reuses their buffers (same parameters: a graph)
    eng.synchronize()


def test_in_place_runs_inside_a_batch_commit_only_on_success():
    f = Fusion.from_json(INPLACE)
    eng = Engine("cupy")
    dst_a = cp.zeros(8, np.float32)
    dst_b = cp.full(8, 5, np.float32)
    calls = [(f, {"dst": dst_a, "index": cp.asarray([1, 1, 7]), "src": cp.asarray([1.0, 2.0, 3.0], np.float32)}),
             (f, {"dst": dst_b, "index": cp.asarray([0, 99]), "src": cp.asarray([1.0, 1.0], np.float32)})]
    out = eng.run_batch(calls)
    assert isinstance(out[0], RunResult) and type(out[1]) is RunError
    assert cp.asnumpy(dst_a).tolist() == [0, 3, 0, 0, 0, 0, 0, 3]
    assert cp.asnumpy(dst_b).tolist() == [5] * 8  # the failed run left its input untouched


def test_a_deferred_engine_batch_then_lone_runs():
    g, mk = moe_graphs()[0]
    f = Fusion.from_json(g)
    eng = Engine("cupy", errors="deferred")
    good = mk(128)(np.random.default_rng(3))
    bad = mk(128)(np.random.default_rng(4))
    bad["topk_ids"][0, 0] = 1000
    eng.run(f, {"topk_ids": cp.asarray(bad["topk_ids"])})  # a lone deferred failure ...
    with pytest.raises(DeferredRunError, match="index 1000"):
        eng.run_batch([(f, {"topk_ids": cp.asarray(good["topk_ids"])})])  # ... is raised before the batch
    out = eng.run_batch([(f, {"topk_ids": cp.asarray(good["topk_ids"])})] * 3)
    for r in out:
        np.testing.assert_array_equal(cp.asnumpy(r.outputs["counts"]), run_graph(f, good)["counts"])
    eng.synchronize()
