"""Both backends execute the plan's views (issue 14): a view segment prepares no kernel on the CUDA
backend, a view output of a kernel segment is made as a view of what the kernel wrote (the kernel
does not write it), and the one commit rule (compiler/commit.py) copies exactly the outputs that
would expose an input's buffer or a broadcast. Checked without a GPU through the CUDA runtime's
preparation (`SourcesOnly`: every decision, no compile); tests/gpu/test_view_segments_gpu.py runs
the same graphs on the H200 against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.graphs import view_of_kernel_output, view_only
from segfuse.compiler import FusionDefinition
from segfuse.compiler.cuda.arrays import contiguous_strides
from segfuse.compiler.cuda.prepare import SourcesOnly, prepare_plan
from segfuse.compiler.engine import Engine
from segfuse.compiler.ops.registry import REGISTRY, OpKind
from segfuse.compiler.plan import Plan


def prepared(f, shapes, strides=None):
    bound = f.bind(shapes)
    plan = Engine("numpy").plan(f, shapes)
    st = {n: contiguous_strides(bound.types[n].shape) for n in f.input_names}
    st.update(strides or {})
    return plan, prepare_plan(SourcesOnly(), f, plan, bound, st)


def test_a_view_segment_prepares_no_kernel():
    f = view_only()
    plan, prep = prepared(f, {"x": (4096, 3)})
    assert [s.kind.value for s in plan.segments] == ["view"] and plan.views == {"flat": "x"}
    assert [s.kind for s in prep.steps] == ["view"] and prep.modules == []
    assert prep.kernels == plan.kernel_count == 0


def test_a_view_of_a_non_contiguous_input_is_made_by_a_kernel():
    f = view_only()
    # x transposed in memory: a reshape cannot be a view of it
    plan, prep = prepared(f, {"x": (4096, 3)}, {"x": (1, 4096)})
    assert [s.kind for s in prep.steps] == ["kernel"] and len(prep.modules) == 1
    assert "a kernel makes the view" in prep.fallbacks[0]


def test_the_kernel_does_not_write_the_views_of_its_outputs():
    f = view_of_kernel_output()
    plan, prep = prepared(f, {"x": (512, 7)})
    assert plan.views == {"r": "y", "u": "y"}
    (sid, mod), = prep.modules
    assert "y" in mod.params and "r" not in mod.params and "u" not in mod.params
    # and the plan's launches are the runtime's
    assert prep.kernels == plan.kernel_count == 1


def test_commits_copy_exactly_the_outputs_that_expose_an_input_or_a_broadcast():
    with FusionDefinition("commits") as fd:
        x = fd.define_tensor("x", ["A", "B"], "float32")
        v = fd.define_tensor("v", ["B"], "float32")
        y = fd.ops.exp(x)
        fd.add_output(x)  # an input as it is
        fd.add_output(fd.ops.reshape(x, [-1]), "flat_x")  # a view of an input
        fd.add_output(fd.ops.expand(v, ["A", -1]), "wide")  # a broadcast
        fd.add_output(y, "y")
        fd.add_output(fd.ops.reshape(y, [-1]), "flat_y")  # a view of a result: returned as the view
    f = fd.fusion()
    plan = Engine("numpy").plan(f, {"x": (64, 5), "v": (5,)})
    assert {c.name: c.copy for c in plan.commits} == {"x": True, "flat_x": True, "wide": True, "y": False,
                                                       "flat_y": False}
    # the plan round-trips through JSON with its commits and alias modes as plain strings
    again = Plan.from_dict(plan.to_dict())
    assert again.commits == plan.commits and again.to_json() == plan.to_json()
    # and the NumPy plan backend returns what the commit rule says
    x, v = np.arange(320, dtype=np.float32).reshape(64, 5) / 100, np.ones(5, np.float32)
    out = Engine("numpy").run(f, {"x": x, "v": v}).outputs
    assert not np.shares_memory(out["x"], x) and not np.shares_memory(out["flat_x"], x)
    assert out["wide"].flags.writeable and out["wide"].flags.c_contiguous
    assert np.shares_memory(out["flat_y"], out["y"])
    np.testing.assert_allclose(out["flat_y"], np.exp(x).reshape(-1), rtol=1e-6)


@pytest.mark.parametrize("name", sorted(n for n, o in REGISTRY.items() if o.kind is OpKind.view))
def test_every_view_op_makes_its_view_without_moving_data(name):
    op = REGISTRY[name]
    assert op.view is not None, f"{name}: a view op needs a `view` function (compiler/ops/registry.py)"
    cases = {"reshape": ({"shape": [6, -1]}, (2, 3, 4)), "squeeze": ({"dims": [1]}, (2, 1, 4)),
             "unsqueeze": ({"dim": 1}, (2, 4)), "expand": ({"shape": [3, -1, 4]}, (1, 1, 4)),
             "broadcast_in_dim": ({"shape": [3, 2, 4], "broadcast_dims": [1, 2]}, (2, 4))}
    attrs, shape = cases[name]
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    with FusionDefinition(f"one_{name}") as fd:
        t = fd.define_tensor("x", list(shape), "float32")
        fd.add_output(getattr(fd.ops, name)(t, **attrs), "o")
    f = fd.fusion()
    node = f.nodes[0]
    out_t = f.bind({"x": shape}).types["o"]
    got = op.view(np, x, node.attrs, out_t)
    assert np.shares_memory(got, x) and got.shape == tuple(out_t.shape)
    # the same values PyTorch's own view gives (an independent oracle)
    import torch

    tx = torch.from_numpy(x)
    want = {"reshape": lambda: tx.reshape(6, -1), "squeeze": lambda: tx.squeeze(1),
            "unsqueeze": lambda: tx.unsqueeze(1), "expand": lambda: tx.expand(3, -1, 4),
            "broadcast_in_dim": lambda: tx.unsqueeze(0).expand(3, 2, 4)}[name]()
    np.testing.assert_array_equal(got, want.numpy())
