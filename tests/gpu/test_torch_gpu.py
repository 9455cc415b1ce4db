"""segfuse.torch on CUDA tensors: results equal to torch's own ops; inputs read without copies (the
same data pointers) and outputs and buffers from torch's caching allocator, each output on a
storage of its own; eager calls queued back to back on two streams; launches on torch's
current stream (ordered after a side stream's work, no host synchronization); capture in
`torch.cuda.graph` and replay on new input contents; a bad index inside a replay reported
afterwards with the context still usable; `torch.compile` with the op on CUDA tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
cp = pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA GPU", allow_module_level=True)

import segfuse.torch as sft  # noqa: E402
from segfuse.compiler.errors import DeferredRunError  # noqa: E402
from segfuse.torch import cuda_path  # noqa: E402
from torch_graphs import SCATTER_ADD, E, K, prologue_graph, torch_prologue  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
SLEEP_CYCLES = 200_000_000  # torch.cuda._sleep: ~0.1 s of GPU time at ~2 GHz


def _ids(T, idt="int64", seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randint(0, E, (T, K), device=DEV, dtype=getattr(torch, idt), generator=g)


def _equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device == w.device and g.shape == w.shape
        assert torch.equal(g.long(), w.long())


@pytest.fixture(autouse=True)
def _no_pending_errors():
    sft.check()  # nothing left over from an earlier test
    yield
    sft.check()


@pytest.mark.parametrize("idt", ["int64", "int32"])
@pytest.mark.parametrize("T", [1, 128, 1000, 4096, 16384, 65536])
def test_prologue_matches_torch(T, idt):
    op = sft.fusion(prologue_graph(idt))
    for seed in range(3):  # the first call prepares, later ones find the signature
        ids = _ids(T, idt, seed)
        _equal(op(ids), torch_prologue(ids))


def test_elementwise_and_bfloat16_match_torch():
    chain = sft.fusion("examples/elementwise_chain.json")
    a, b, c = (torch.randn(1000, device=DEV) for _ in range(3))
    torch.testing.assert_close(chain(a, b, c), torch.where(a > 0, a * b + c, torch.exp(c) * 0.5))
    g = {"format": "segfuse.fusion/1", "name": "bf16_mul",
         "inputs": [{"name": "x", "dtype": "bfloat16", "shape": ["N"]}, {"name": "y", "dtype": "bfloat16", "shape": ["N"]}],
         "ops": [{"op": "mul", "out": "z", "inputs": ["x", "y"]}, {"op": "gt", "out": "pos", "inputs": ["z", 0]}],
         "outputs": ["z", "pos"]}
    x, y = (torch.randn(513, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    z, pos = sft.fusion(g)(x, y)
    assert z.dtype is torch.bfloat16 and pos.dtype is torch.bool
    torch.testing.assert_close(z, x * y)
    assert torch.equal(pos, (x * y) > 0)


def test_no_copies_and_outputs_from_torch_allocator(monkeypatch):
    op = sft.fusion(prologue_graph())
    ids = _ids(4096)
    op(ids)  # prepared, its allocations recorded
    seen_in = []
    to_cupy = cuda_path.to_cupy

    def spy_in(sig, tensors):
        env = to_cupy(sig, tensors)
        seen_in.append([(t.data_ptr(), env[n].data.ptr) for n, t in zip(sig.names, tensors)])
        return env

    monkeypatch.setattr(cuda_path, "to_cupy", spy_in)
    pool = cp.get_default_memory_pool()
    torch.cuda.synchronize()
    outs = []
    for call in range(3):  # calls that follow the recorded allocations (the outputs made first)
        x = ids.clone() if call == 1 else ids  # (a tensor at another address: a new view of it)
        kept = {o.data_ptr() for o in outs}  # (outputs let go of: the next call may take them back)
        outs = None
        used, before = pool.used_bytes(), torch.cuda.memory_allocated()
        seen_in.clear()
        outs = op(x)
        # the kernels read the tensor itself (a call replaying an earlier call's CUDA graph binds
        # nothing: it replays only where every pointer, the input's included, is that call's)
        assert seen_in in ([], [[(x.data_ptr(), x.data_ptr())]])
        assert pool.used_bytes() == used  # nothing of the call from CuPy's own pool
        fresh = [o for o in outs if o.data_ptr() not in kept]
        assert torch.cuda.memory_allocated() - before >= sum(o.numel() * o.element_size() for o in fresh)
        for o in outs:  # each on a storage of the caching allocator's own, at its start
            assert o.untyped_storage().data_ptr() == o.data_ptr() and o.is_contiguous()
        assert len({o.untyped_storage().data_ptr() for o in outs} | {x.data_ptr()}) == len(outs) + 1
        _equal(outs, torch_prologue(x))
    # an alias_of input is updated in place, through the same pointer
    upd = sft.fusion(SCATTER_ADD)
    dst = torch.zeros(300, device=DEV)
    index = torch.randint(0, 300, (5000,), device=DEV)
    src = torch.randn(5000, device=DEV)
    ptr, want = dst.data_ptr(), torch.zeros(300, device=DEV).scatter_add_(0, index, src)
    assert upd(dst, index, src) is dst and dst.data_ptr() == ptr
    torch.testing.assert_close(dst, want)


def test_launches_on_the_current_stream_after_side_stream_work():
    op = sft.fusion(prologue_graph())
    ids = _ids(4096)
    op(ids)
    new = _ids(4096, seed=7)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)  # the copy below runs only after this
        ids.copy_(new)
        outs = op(ids)  # must read the new ids: ordered after the copy on this stream
        assert not side.query(), "the call waited for the stream (a host synchronization)"
        want = torch_prologue(new)
    side.synchronize()
    _equal(outs, want)


def test_eager_calls_queued_back_to_back_on_two_streams():
    """Calls queued behind a busy GPU, alternating between two streams, each on new ids: every
    result right (a stream's kept arena is reused only in that stream's order), and the op
    through the dispatcher (`op.op`) gives the same."""
    op = sft.fusion(prologue_graph())
    for T in (128, 4096):
        op(_ids(T))
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()]
    streams[1].wait_stream(streams[0])
    pending = []
    for i in range(24):
        s = streams[i % 2]
        with torch.cuda.stream(s):
            if i < 2:
                torch.cuda._sleep(SLEEP_CYCLES // 4)
            ids = _ids(128 if i % 3 else 4096, seed=50 + i)
            pending.append((ids, op(ids) if i % 4 else op.op(ids)))
    torch.cuda.synchronize()
    for ids, outs in pending:
        _equal(outs, torch_prologue(ids))


def test_repeated_calls_replay_a_graph_of_their_launches_on_new_contents():
    """Calls repeated on one stream get the same memory from the caching allocator: from the third
    on, a kernels-only plan's call replays the CUDA graph of an earlier call's launches (nothing
    bound), and each call's results are those of its own ids; a bad index is still reported."""
    op = sft.fusion(prologue_graph())
    ids = _ids(1)
    want = []
    for seed in range(6):  # the same input tensor, new contents each call; results kept on the side
        ids.copy_(_ids(1, seed=seed + 1))
        outs = op(ids)
        want.append((torch_prologue(ids), [o.clone() for o in outs]))
        del outs
    for w, got in want:
        _equal(got, w)
    sig = op._cuda.sigs[cuda_path._key((ids,))]
    if all(s.kind == "kernel" for s in sig.prep.steps):
        assert sig.memo, "no call's graph was remembered"
    ids[0, 0] = E + 5  # a bad index, in a replayed graph: reported by the next call
    op(ids)
    torch.cuda.synchronize()
    with pytest.raises(DeferredRunError, match="out of bounds"):
        sft.check()


def test_eager_calls_take_back_only_the_outputs_their_caller_let_go_of():
    """A direct eager call keeps its outputs: the next call on the stream writes into each one its
    caller let go of (the same memory), after everything queued before it on the stream (a copy of
    an output behind a busy GPU still gets that call's results), and makes anew each one the caller
    still holds, which keeps its results."""
    op = sft.fusion(prologue_graph())
    for seed in range(3):  # records, follows its plan, keeps
        op(_ids(128, seed=seed))
    outs = op(_ids(128, seed=3))
    ptrs = [o.data_ptr() for o in outs]
    del outs
    ids2 = _ids(128, seed=4)
    outs = op(ids2)
    assert [o.data_ptr() for o in outs] == ptrs
    torch.cuda._sleep(SLEEP_CYCLES)  # the read below waits behind this, the next call behind it
    snapshot = outs[3].clone()
    held = outs[2]
    del outs
    ids3 = _ids(128, seed=5)
    outs3 = op(ids3)
    assert [o.data_ptr() for o in outs3][:2] + [o.data_ptr() for o in outs3][3:] == ptrs[:2] + ptrs[3:]
    assert outs3[2].data_ptr() != held.data_ptr()
    want2, want3 = torch_prologue(ids2), torch_prologue(ids3)
    torch.cuda.synchronize()
    _equal([held], [want2[2]])
    _equal([snapshot], [want2[3]])
    _equal(outs3, want3)


def test_no_host_synchronization_on_the_call_path():
    op = sft.fusion(prologue_graph())
    ids = _ids(128)
    op(ids)
    torch.cuda._sleep(SLEEP_CYCLES)
    for _ in range(3):
        outs = op(ids)
    assert not torch.cuda.current_stream().query(), "a call waited for the GPU"
    torch.cuda.synchronize()
    _equal(outs, torch_prologue(ids))


@pytest.mark.parametrize("T", [1, 4096, 65536])
def test_capture_and_replay_on_new_contents(T):
    op = sft.fusion(prologue_graph())
    upd = sft.fusion(SCATTER_ADD)
    ids = _ids(T)
    dst = torch.zeros(64, device=DEV)
    index = torch.randint(0, 64, (T,), device=DEV)
    src = torch.ones(T, device=DEV)
    op.warmup(ids)
    upd.warmup(dst, index, src)
    assert torch.equal(dst, torch.zeros(64, device=DEV))  # warmup leaves alias_of inputs alone
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = op(ids)
        upd(dst, index, src)
    for seed in (3, 4):
        new = _ids(T, seed=seed)
        ids.copy_(new)
        index.copy_(torch.randint(0, 64, (T,), device=DEV))
        before = dst.clone()
        g.replay()
        torch.cuda.synchronize()
        _equal(outs, torch_prologue(new))
        torch.testing.assert_close(dst, before.scatter_add_(0, index, src))


def test_capture_of_a_signature_never_run_is_refused():
    op = sft.fusion(prologue_graph())
    ids = _ids(333)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="warmup"):
        with torch.cuda.graph(g):
            op(ids)
    op.warmup(ids)  # then it captures
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = op(ids)
    g.replay()
    torch.cuda.synchronize()
    _equal(outs, torch_prologue(ids))


def test_bad_index_in_a_replay_is_reported_afterwards():
    op = sft.fusion(prologue_graph())
    ids = _ids(4096)
    op.warmup(ids)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = op(ids)
    good = ids.clone()
    ids[17, 3] = E + 44  # an expert id past the counts' size
    g.replay()
    with pytest.raises(DeferredRunError, match=rf"scatter: index {E + 44} is out of bounds for dimension 0 with size {E}"):
        sft.check()
    sft.check()  # reported once, then cleared
    ids.copy_(good)
    g.replay()
    torch.cuda.synchronize()
    _equal(outs, torch_prologue(good))
    _equal(op(good), torch_prologue(good))  # eager calls too
    # a failure of an eager call is raised by the next call (no synchronization in between)
    ids[0, 0] = -1 - E
    op(ids)
    torch.cuda.synchronize()
    with pytest.raises(DeferredRunError, match="moe_prologue_int64"):
        op(good)
    _equal(op(good), torch_prologue(good))


def test_torch_compile_on_cuda():
    op = sft.fusion(prologue_graph())

    def decode_step(logits):
        _, topk_ids = torch.topk(logits, K, dim=-1)
        counts, offsets, input_perm, output_perm = op(topk_ids)
        return counts, offsets[1:] - offsets[:-1], input_perm[output_perm]

    for T in (16, 16, 100):
        logits = torch.randn(T, E, device=DEV)
        want = decode_step(logits)
        got = torch.compile(decode_step, fullgraph=True)(logits)
        _equal(got, want)
        assert torch.equal(got[1], got[0])


def test_out_tensors_are_written():
    """`out=` tensors are returned in the outputs' places with the results; once the signature's
    allocations are planned the kernels write them directly (no other memory for them, the
    version counter bumped as an out= op bumps it), also on new ids at the same pointers."""
    op = sft.fusion(prologue_graph())
    ids = _ids(128)
    buf = torch.empty(E, dtype=torch.int64, device=DEV)
    res = op(ids, out={"counts": buf})
    assert res[0] is buf
    _equal(res, torch_prologue(ids))
    op(ids)  # (planned)
    perm = torch.empty(128 * K, dtype=torch.int64, device=DEV)
    for seed in range(3):
        ids.copy_(_ids(128, seed=seed + 1))
        version, ptr = perm._version, perm.data_ptr()
        res = op(ids, out=[buf, None, None, perm])
        assert res[0] is buf and res[3] is perm and perm.data_ptr() == ptr and perm._version > version
        _equal(res, torch_prologue(ids))


def test_threads_on_streams_of_their_own():
    import threading

    op = sft.fusion(prologue_graph())
    for T in (64, 4096):
        op(_ids(T))  # prepared on this thread; each thread gets stream states of its own
    errors, results = [], {}

    def work(k):
        try:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                for i in range(20):
                    ids = _ids(64 if (k + i) % 2 else 4096, seed=100 * k + i)
                    results[(k, i)] = (ids, op(ids))
            s.synchronize()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for ids, outs in results.values():
        _equal(outs, torch_prologue(ids))


def test_torch_compile_reduce_overhead_on_cuda():
    op = sft.fusion(prologue_graph())

    def step(logits):
        _, topk_ids = torch.topk(logits, K, dim=-1)
        counts, offsets, input_perm, output_perm = op(topk_ids)
        return counts, offsets, input_perm[output_perm]

    compiled = torch.compile(step, fullgraph=True, mode="reduce-overhead")  # torch's CUDA graphs around it
    for _ in range(4):
        new = torch.randn(256, E, device=DEV)
        got = [t.clone() for t in compiled(new)]
        _equal(got, step(new))


def test_the_gpu_blocks_of_docs_torch_md_run(tmp_path):
    """docs/torch.md's Python blocks, the GPU ones (`<!-- not run: needs a GPU ... -->` on a CPU
    machine) included, in order in one directory."""
    import subprocess
    import sys
    from pathlib import Path

    from helpers.doc_sessions import blocks as doc_blocks

    doc = Path(__file__).resolve().parents[2] / "docs" / "torch.md"
    blocks = [b for b in doc_blocks(doc) if b.lang == "python" and not b.is_output]
    assert sum("needs a GPU" in b.directive for b in blocks) >= 3
    for b in blocks:
        script = tmp_path / f"block_{b.line}.py"
        script.write_text(b.code)
        r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{b} exited {r.returncode}:\n{r.stdout}{r.stderr}"
