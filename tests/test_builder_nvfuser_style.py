"""FusionDefinition written the way nvFuser's users write it: `DataType`, `define_tensor(shape=[-1, -1],
contiguity=...)`, `define_scalar`, nvFuser's argument orders and names of ops, `execute([...])` on torch
tensors returning a list; nvFuser's MoE routing tests ported with only the import changed. PyTorch
eager on the CPU is the oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from segfuse.compiler import DataType, FusionDefinition, GraphError  # nvFuser: from nvfuser import ...


def exec_nvfuser(fusion_func, inputs):
    """What nvFuser's tests call: define with `fusion_func`, run on the inputs, a list back."""
    with FusionDefinition() as fd:
        fusion_func(fd)
    return fd.execute(inputs), fd


def assert_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert isinstance(actual, torch.Tensor), type(actual)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (actual.dtype, actual.shape, expected)
    if expected.dtype.is_floating_point:
        torch.testing.assert_close(actual, expected)
    else:
        assert torch.equal(actual, expected), (actual, expected)


def define_2d(fd, dtype):
    return fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=dtype, is_cpu=False, stride_order=[1, 0])


# ---- nvFuser's tests, ported: only the import line differs -----------------------------------------
def test_scatter_output_intermediate():
    bsz, hidden, scatter_size, scatter_dim = 128, 64, 16, 0
    x = torch.randn([bsz, hidden])
    _, ind = torch.topk(x, k=scatter_size, dim=scatter_dim)
    src = torch.randn(scatter_size, hidden)
    inputs = [x, ind, src]

    def fusion_func(fd: FusionDefinition):
        T0 = define_2d(fd, DataType.Float)
        T1 = define_2d(fd, DataType.Int)
        T2 = define_2d(fd, DataType.Float)
        T3 = fd.ops.scatter(T0, T1, T2, scatter_dim)
        T4 = fd.ops.sigmoid(T3)
        fd.add_output(T4)

    nvf_out, _ = exec_nvfuser(fusion_func, inputs)
    assert_equal(nvf_out[0], torch.sigmoid(torch.scatter(x, scatter_dim, ind, src)))


def test_scatter_scalar_src():
    bsz, hidden, scatter_size, scatter_dim = 128, 64, 16, 0
    x = torch.randn([bsz, hidden])
    _, ind = torch.topk(x, k=scatter_size, dim=scatter_dim)
    src = 1.5
    inputs = [x, ind, src]

    def fusion_func(fd: FusionDefinition):
        T0 = define_2d(fd, DataType.Float)
        T1 = define_2d(fd, DataType.Int)
        S2 = fd.define_scalar(None, dtype=DataType.Double)
        T3 = fd.ops.scatter(T0, T1, S2, scatter_dim)
        fd.add_output(T3)

    nvf_out, _ = exec_nvfuser(fusion_func, inputs)
    assert_equal(nvf_out[0], torch.scatter(x, scatter_dim, ind, src))


def test_cumsum_int():
    inputs = [torch.testing.make_tensor((4,), dtype=torch.int32, device="cpu")]

    def fusion_func(fd: FusionDefinition):
        T0 = fd.from_pytorch(inputs[0])
        T1 = fd.ops.cumsum(T0, dim=-1)
        T2 = fd.ops.cast(T1, dtype=DataType.Int)
        fd.add_output(T2)

    nvf_out, _ = exec_nvfuser(fusion_func, inputs)
    assert_equal(nvf_out[0], torch.cumsum(inputs[0], dim=-1))


@pytest.mark.parametrize("index_dtype", [torch.int, torch.long])
def test_index_put_accumulate(index_dtype):
    vocab, hidden, seq = 64, 12, 300
    acc = torch.testing.make_tensor((vocab, hidden), dtype=torch.float32, device="cpu")
    index = torch.testing.make_tensor((seq,), low=0, high=vocab, dtype=index_dtype, device="cpu")
    value = torch.testing.make_tensor((seq, hidden), dtype=torch.float32, device="cpu")

    def fusion_func(fd: FusionDefinition):
        T0 = fd.from_pytorch(acc)
        T1 = fd.from_pytorch(index)
        T2 = fd.from_pytorch(value)
        T3 = fd.ops.index_put_accumulate(T0, T1, T2)
        fd.add_output(T3)

    nvf_out, _ = exec_nvfuser(fusion_func, [acc, index, value])
    assert_equal(nvf_out[0], torch.index_put(acc, [index], value, accumulate=True))


def llama4_routing(fd: FusionDefinition, num_experts: int) -> None:
    """The routing of nvFuser's tests/python/test_moe.py (Llama4MoE.run_routed_experts), as a
    fusion definition: topk(1) router, token counts per expert by a scatter, the tokens sorted by
    expert, offsets by a cumsum in int32, and the inverse permutation."""
    T0 = define_2d(fd, DataType.Float)  # hidden_states [s, h]
    T1 = define_2d(fd, DataType.Float)  # router_logits [s, n]
    T2, T3 = fd.ops.topk(T1, 1, dim=1, largest=True, sorted=True)  # [s, 1]
    T4 = fd.ops.sigmoid(T2)
    T5 = fd.ops.mul(T0, T4)
    S6 = fd.ops.size(T1, 0)
    V7 = fd.define_vector([S6, num_experts], dtype=DataType.Int)
    S8 = fd.define_scalar(0, dtype=DataType.Int)
    T9 = fd.ops.full(shape=V7, fill_value=S8, dtype=DataType.Int32)
    S10 = fd.define_scalar(1, dtype=DataType.Int)
    T11 = fd.ops.scatter(T9, T3, S10, dim=1)
    T12 = fd.ops.sum(T11, dims=[0], keepdim=False, dtype=DataType.Null)  # tokens per expert
    T13 = fd.ops.reshape(T3, new_shape=[S6])
    T14 = fd.ops.argsort(T13, dim=0, descending=False, stable=True)
    T15 = fd.ops.index_select(T5, T14, dim=0)  # tokens sorted by expert
    T16 = fd.ops.cumsum(T12, dim=0)
    T17 = fd.ops.cast(T16, dtype=DataType.Int32)  # offsets
    T18 = fd.ops.argsort(T14, dim=0, descending=False, stable=True)
    for t in (T12, T14, T15, T17, T18):
        fd.add_output(t)


def llama4_routing_torch(hidden_states, router_logits, num_experts):
    topk_weight, topk_ids = router_logits.topk(1)
    hidden_states = hidden_states * topk_weight.sigmoid()
    counts = torch.zeros(topk_ids.size(0), num_experts, dtype=torch.int32).scatter(1, topk_ids, 1)
    tokens_per_expert = counts.sum(0)
    sorted_ids = topk_ids.view(-1).argsort(stable=True)
    offsets = torch.cumsum(tokens_per_expert, 0, dtype=torch.int32)
    return [tokens_per_expert, sorted_ids, hidden_states[sorted_ids], offsets, torch.argsort(sorted_ids, stable=True)]


def test_llama4_moe_routing_runs_at_every_sequence_length():
    n = 8

    def fusion_func(fd: FusionDefinition):
        llama4_routing(fd, n)

    with FusionDefinition() as fd:
        fusion_func(fd)
    for s in (5, 33):  # one definition, two sequence lengths (the -1 sizes are symbols)
        hidden_states, router_logits = torch.randn(s, 16), torch.randn(s, n)
        outs = fd.execute([hidden_states, router_logits])
        expected = llama4_routing_torch(hidden_states, router_logits, n)
        assert len(outs) == len(expected)
        for got, want in zip(outs, expected):
            assert_equal(got, want)


def test_alias_output_to_input():
    in_tensors = [torch.ones(4, 4)]

    def fusion_func(fd: FusionDefinition):
        t0 = fd.from_pytorch(in_tensors[0])  # = 1.0
        one = fd.define_scalar(1.0)
        two = fd.define_scalar(2.0)
        t1 = fd.ops.add(t0, one)  # = 2.0
        t2 = fd.ops.add(t1, two)  # = 4.0
        fd.add_output(t1, alias_input=t0)
        fd.add_output(t2)

    expected_in = in_tensors[0] + 1.0
    out_tensors, _ = exec_nvfuser(fusion_func, in_tensors)
    assert len(out_tensors) == 1  # t1 aliases an input, so it is left out, as in nvFuser
    assert_equal(out_tensors[0], expected_in + 2.0)
    assert_equal(in_tensors[0], expected_in)


# ---- define_tensor, define_scalar, DataType ---------------------------------------------------------
def test_each_minus_one_is_a_fresh_size_symbol():
    with FusionDefinition() as fd:
        a = define_2d(fd, DataType.Float)
        b = define_2d(fd, DataType.Float)
        fd.add_output(fd.ops.sum(a, dims=[1]))
        fd.add_output(fd.ops.sum(b, dims=[0]))
    shapes = [i["shape"] for i in fd.to_dict()["inputs"]]
    assert len({d for s in shapes for d in s}) == 4 and all(isinstance(d, str) for s in shapes for d in s)
    for sa, sb in (((3, 5), (7, 2)), ((6, 1), (1, 9))):  # unrelated sizes, at two sizes each
        x, y = torch.randn(*sa), torch.randn(*sb)
        got = fd.execute([x, y])
        assert_equal(got[0], x.sum(1))
        assert_equal(got[1], y.sum(0))


def test_contiguity_and_stride_order_are_accepted_and_any_layout_runs():
    x = torch.randn(6, 4).t()  # a transposed view: column-major, as nvFuser's stride_order [0, 1] says
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, stride_order=[0, 1])
        t1 = fd.define_tensor([-1, 1], [True, None], DataType.Float)  # nvFuser's positional form
        t2 = fd.define_tensor(shape=[-1], contiguity=False, dtype=DataType.Float)
        fd.add_output(fd.ops.add(fd.ops.mul(t0, t1), t2))
    y, z = torch.randn(4, 1), torch.randn(6)
    (got,) = fd.execute([x, y, z])
    assert_equal(got, x * y + z)
    with pytest.raises(ValueError, match="contiguity has 1 entries for a tensor of rank 2"):
        fd.define_tensor(shape=[-1, -1], contiguity=[True], dtype=DataType.Float)
    with pytest.raises(ValueError, match="not a permutation"):
        fd.define_tensor(shape=[-1, -1], contiguity=[True, True], stride_order=[0, 0])


def test_execute_list_returns_torch_tensors_and_numpy_for_numpy():
    x = torch.randn(3, 5)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.exp(t0))
        fd.add_output(fd.ops.amax(t0, [1]))
    out = fd.execute([x])
    assert isinstance(out, list) and len(out) == 2
    assert_equal(out[0], torch.exp(x))
    assert_equal(out[1], torch.amax(x, 1))
    out_np = fd.execute([x.numpy()])
    assert isinstance(out_np[0], np.ndarray)
    assert_equal(torch.from_numpy(out_np[0]), torch.exp(x))
    with pytest.raises(TypeError, match=r"takes 1 inputs in definition order \(input_0\), got 2"):
        fd.execute([x, x])


def test_dict_execute_is_unchanged():
    with FusionDefinition("named") as fd:
        a = fd.define_tensor("a", ["T", 3], "float32")
        fd.add_output(fd.ops.exp(a), "e")
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    out = fd.execute({"a": x})
    assert isinstance(out, dict) and list(out) == ["e"] and isinstance(out["e"], np.ndarray)
    assert_equal(torch.from_numpy(out["e"]), torch.exp(torch.from_numpy(x)))
    assert fd.to_dict()["inputs"] == [{"name": "a", "dtype": "float32", "shape": ["T", 3]}]


# nvFuser's own table (nvfuser/pytorch_utils.py): torch dtype <-> DataType
NVFUSER_DTYPES = [(DataType.Double, torch.float64), (DataType.Float, torch.float32), (DataType.Half, torch.float16),
                  (DataType.BFloat16, torch.bfloat16), (DataType.Int, torch.int64), (DataType.Int32, torch.int32),
                  (DataType.Bool, torch.bool)]


@pytest.mark.parametrize("data_type, torch_dtype", NVFUSER_DTYPES, ids=[d.name for d, _ in NVFUSER_DTYPES])
def test_datatype_names_map_to_torch_dtypes(data_type, torch_dtype):
    x = torch.testing.make_tensor((5,), dtype=torch_dtype, device="cpu", low=-4, high=4)
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=data_type)
        fd.add_output(fd.ops.cast(t0, dtype=data_type))
        fd.add_output(fd.ops.cast(fd.ops.cast(t0, DataType.Double), dtype=data_type))
        fd.add_output(fd.ops.full([2], fill_value=fd.define_scalar(1, dtype=data_type), dtype=data_type))
    same, through_double, ones = fd.execute([x])
    assert_equal(same, x)
    assert_equal(through_double, x.to(torch.float64).to(torch_dtype))
    assert_equal(ones, torch.full([2], 1, dtype=torch_dtype))


@pytest.mark.parametrize("data_type", [DataType.ComplexFloat, DataType.ComplexDouble])
def test_complex_datatypes_are_refused_with_the_supported_ones_named(data_type):
    fd = FusionDefinition()
    with pytest.raises(TypeError, match=rf"DataType.{data_type.name} is not supported: segfuse does not compute "
                                        r"in complex numbers; its dtypes are bool, .*float64"):
        fd.define_tensor(shape=[-1], contiguity=[True], dtype=data_type)
    t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
    with pytest.raises(TypeError, match="complex numbers"):
        fd.ops.cast(t0, dtype=data_type)
    with pytest.raises(TypeError, match="torch.complex64 is not supported"):
        fd.from_pytorch(torch.zeros(2, dtype=torch.complex64))
    assert [i["name"] for i in fd.to_dict()["inputs"]] == ["input_0"]  # the refusals left nothing behind


def test_define_scalar_inputs_and_constants():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        s_in = fd.define_scalar(dtype=DataType.Double)  # an input, given as a number
        c_float = fd.define_scalar(2, dtype=DataType.Double)  # a constant: 2.0
        fd.add_output(fd.ops.mul(fd.ops.add(t0, s_in), c_float))
        fd.add_output(fd.ops.div(fd.define_scalar(7, dtype=DataType.Int), fd.ops.cast(t0, DataType.Int)))
    x = torch.tensor([1.0, -2.5, 3.0])
    scaled, quotient = fd.execute([x, 0.5])
    assert_equal(scaled, (x + torch.tensor(0.5, dtype=torch.float64)) * 2.0)
    assert_equal(quotient, torch.div(7, x.to(torch.int64)))
    with pytest.raises(TypeError, match="no vector inputs"):
        fd.define_vector(3)


def test_subclass_definition_runs_on_first_use():
    class Exp(FusionDefinition):
        def definition(self):
            t0 = self.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
            self.add_output(self.ops.exp(t0))

    x = torch.randn(2, 3)
    (got,) = Exp().execute([x])
    assert_equal(got, torch.exp(x))


# ---- nvFuser's argument orders and names of ops -------------------------------------------------------
def test_nvfuser_orders_and_names_of_ops_match_torch():
    x = torch.randn(6, 5)
    i = torch.randint(0, 6, (4, 5))
    r = torch.randint(0, 6, (3,))
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        t1 = fd.from_pytorch(i)
        t2 = fd.from_pytorch(r)
        outs = [
            fd.ops.gather(t0, t1, 0),  # nvFuser: (arg, index, dim)
            fd.ops.take_along_axis(t0, t1, 0),
            fd.ops.index_select(t0, t2, dim=0),
            fd.ops.sum(t0, dim=1, keepdim=True),
            fd.ops.sum(t0, DataType.Double),  # a full reduction in nvFuser's (arg, dtype) form
            fd.ops.max(t0, dims=[0]),
            fd.ops.min(t0, [1], True),
            fd.ops.full(shape=[2, 3], fill_value=1.5, dtype=DataType.Half),
            fd.ops.iota(fd.define_scalar(4), fd.define_scalar(2), fd.define_scalar(3), DataType.Int32),
            fd.ops.pad(t0, pad_widths=[1, 2], value=fd.define_scalar(-1.0)),
            fd.ops.reshape(t0, new_shape=[-1]),
            fd.ops.broadcast_in_dim(t2, shape=[2, 3], broadcast_dims=[1]),
            fd.ops.broadcast(t2, [True, False, True]),
            fd.ops.squeeze(fd.ops.broadcast(t0, [True, False, False]), [0], squeeze_expanded=False),
            fd.ops.slice(t0, [1, 0], [5, 5], [2, 1]),
            fd.ops.select(t0, 2, dim=1),  # nvFuser: (arg, index, dim)
            fd.ops.truediv(t1, 4),
            fd.ops.bitwise_left_shift(t1, 2),
            fd.ops.var(t0, [1], 0, False),
            fd.ops.cat([t0, t0], dim=1, manual_padding=False),
        ]
        for t in outs:
            fd.add_output(t)
    expected = [
        torch.gather(x, 0, i), torch.take_along_dim(x, i, 0), torch.index_select(x, 0, r), x.sum(1, keepdim=True),
        x.sum(dtype=torch.float64), x.amax(0), x.amin(1, keepdim=True), torch.full([2, 3], 1.5, dtype=torch.float16),
        torch.arange(2, 2 + 3 * 4, 3, dtype=torch.int32), torch.nn.functional.pad(x, [1, 2], value=-1.0),
        x.reshape(-1), r.expand(2, 3), r[None, :, None], x, x[1:5:2], x.select(1, 2), i / 4, i << 2,
        x.var(1, correction=0), torch.cat([x, x], 1),
    ]
    got = fd.execute([x, i, r])
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, k
        assert_equal(g, e)


def test_pytorch_order_is_read_first_and_mistakes_name_pytorchs_parameters():
    x = torch.randn(4, 3)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.select(t0, 1, 0))  # fits both orders: PyTorch's select(x, dim=1, index=0)
        index = fd.ops.expand(fd.ops.unsqueeze(fd.ops.iota(2), 1), [2, 3])
        fd.add_output(fd.ops.gather(t0, 0, index))  # PyTorch's gather(input, dim, index)
    got = fd.execute([x])
    assert_equal(got[0], x.select(1, 0))
    assert_equal(got[1], torch.gather(x, 0, torch.arange(2)[:, None].expand(2, 3)))
    with pytest.raises(TypeError, match=r"unexpected argument 'dimz' \(takes x, dims, keepdim, dtype\)"):
        fd.ops.sum(t0, dimz=1)
    with pytest.raises(TypeError, match=r"dim is a constant .* in nvFuser's order \(x, index, dim\): index is a "
                                        "constant .*give the number itself"):
        fd.ops.select(t0, fd.define_scalar(dtype=DataType.Int), 1)  # nvFuser's select with a scalar input
    with pytest.raises(TypeError, match="squeeze_expanded=True is not supported"):
        fd.ops.squeeze(t0, [0], squeeze_expanded=True)
    with pytest.raises(ValueError, match="segfuse's outputs are row-major"):
        fd.add_output(t0, stride_order=[0, 1])
    with pytest.raises(GraphError):
        fd.ops.scatter(t0, fd.ops.cast(t0, DataType.Int), t0, dim=5)  # nvFuser's order, checked like any call
