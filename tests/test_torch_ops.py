"""gpupool's PyTorch operators (``torch.ops.gpupool``): opcheck, torch.compile, export,
torch.func, channels_last, and what a gradient keeps from its forward's arguments. Expected
values come from PyTorch's own pooling."""
from __future__ import annotations

import io

import numpy as np
import pytest

import gpupool

torch = pytest.importorskip("torch")
pytest.importorskip("gpupool.interop.torch_ops")  # the operators: the first tensor loads them
F = torch.nn.functional
OPS = torch.ops.gpupool


def _tensor(shape, seed=0, **kw):
    return torch.tensor(np.random.default_rng(seed).standard_normal(shape), **kw)


def _samples():
    x = _tensor((2, 3, 7, 6), requires_grad=True)
    grad = _tensor((2, 3, 4, 3), seed=1, requires_grad=True)
    window = ([2, 2], [2, 2], [1, 1, 0, 0], "", [1, 1], True)
    values, indices = OPS.max_pool(x.detach(), *window, "NCHW")
    adaptive_indices = OPS.adaptive_max_pool(x.detach(), [4, 3], "NCHW")[1]
    return [
        (OPS.max_pool.default, (x, *window, "NCHW")),
        (OPS.max_pool.default, (x, [3, 3], [2, 1], [], "same", [1, 2], False, "NHWC")),
        (OPS.avg_pool.default, (x, *window, True, None, "NCHW")),
        (OPS.avg_pool.default, (x, *window, False, 3, "NCHW")),
        (OPS.lp_pool.default, (x, 3.0, *window, "NCHW")),
        (OPS.adaptive_avg_pool.default, (x, [3, 4], "NCHW")),
        (OPS.adaptive_max_pool.default, (x, [3, 4], "NCHW")),
        (OPS.global_avg_pool.default, (x, 2, "NCHW")),
        (OPS.max_pool_backward.default, (grad, indices, [2, 3, 7, 6], *window, "NCHW", True)),
        (OPS.avg_pool_backward.default, (grad, [2, 3, 7, 6], *window, True, None, "NCHW")),
        (OPS.lp_pool_backward.default, (grad, x, 2.0, *window, "NCHW")),
        (OPS.adaptive_avg_pool_backward.default, (grad, [2, 3, 7, 6], [4, 3], "NCHW")),
        (OPS.adaptive_max_pool_backward.default,
         (grad, adaptive_indices, [2, 3, 7, 6], [4, 3], "NCHW", False)),
        (OPS.global_avg_pool_backward.default,
         (_tensor((2, 3, 1, 1), requires_grad=True), [2, 3, 7, 6], 2, "NCHW")),
    ]


def test_opcheck():
    """Schema, fake kernel (shapes and strides), autograd registration and dispatch of every
    operator, as ``torch.library.opcheck`` tests them."""
    for op, args in _samples():
        torch.library.opcheck(op, args)


class _Net(torch.nn.Module):
    """A small CNN whose pooling is given: gpupool's or torch.nn.functional's."""

    def __init__(self, pools):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 4)
        self.pools = pools

    def forward(self, x):
        max_pool, avg_pool, lp_pool, global_avg = self.pools
        h = max_pool(torch.relu(self.conv1(x)))
        h = avg_pool(torch.relu(self.conv2(h)))
        h = lp_pool(h)
        return self.head(global_avg(h).flatten(1))


GPUPOOL = (lambda h: gpupool.max_pool(h, 3, 2, 1), lambda h: gpupool.avg_pool(h, 2),
           lambda h: gpupool.lp_pool(h.abs() + 0.1, 2, 2), gpupool.global_avg_pool)
PYTORCH = (lambda h: F.max_pool2d(h, 3, 2, 1), lambda h: F.avg_pool2d(h, 2),
           lambda h: F.lp_pool2d(h.abs() + 0.1, 2, 2), lambda h: h.mean((2, 3), keepdim=True))


def _graphs():
    """A torch.compile backend keeping AOTAutograd's forward and backward graphs."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)
    return graphs, aot_autograd(fw_compiler=keep, bw_compiler=keep)


def _targets(gm) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def test_compile_fullgraph_training_step_equals_pytorch_pooling():
    """One graph (fullgraph=True) with gpupool's operators forward and backward; the loss and
    every parameter's gradient equal the same model's with torch.nn.functional pooling."""
    x = _tensor((2, 3, 16, 16), dtype=torch.float64)
    ours, theirs = _Net(GPUPOOL).double(), _Net(PYTORCH).double()
    graphs, backend = _graphs()
    compiled = torch.compile(ours, fullgraph=True, backend=backend)
    losses = []
    for model, net in ((compiled, ours), (theirs, theirs)):
        loss = model(x).square().sum()
        loss.backward()
        losses.append((loss.item(), [p.grad.numpy() for p in net.parameters()]))
    assert len(graphs) == 2  # one forward, one backward: no graph break
    forward, backward = map(_targets, graphs)
    assert {"gpupool.max_pool.default", "gpupool.avg_pool.default",
            "gpupool.lp_pool.default", "gpupool.global_avg_pool.default"} <= forward
    assert {"gpupool.max_pool_backward.default", "gpupool.avg_pool_backward.default",
            "gpupool.lp_pool_backward.default",
            "gpupool.global_avg_pool_backward.default"} <= backward
    np.testing.assert_allclose(losses[0][0], losses[1][0], rtol=1e-12)
    for a, b in zip(losses[0][1], losses[1][1]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_compile_dynamic_shapes_compiles_once():
    from torch._dynamo.testing import CompileCounterWithBackend
    counter = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda t: gpupool.max_pool(t, 3, 2, 1) + gpupool.adaptive_avg_pool(
        t, (2, 2)).sum(), dynamic=True, fullgraph=True, backend=counter)
    for size in (9, 12, 17):
        t = _tensor((2, 3, size, size + 1), seed=size)
        torch.testing.assert_close(f(t), F.max_pool2d(t, 3, 2, 1)
                                   + F.adaptive_avg_pool2d(t, (2, 2)).sum(), rtol=0, atol=1e-12)
    assert counter.frame_count == 1


def test_export_round_trip():
    class Model(torch.nn.Module):
        def forward(self, t):
            values, indices = gpupool.max_pool(t, 2, return_indices=True)
            return gpupool.avg_pool(values, 2, padding=1) * 2, indices

    program = torch.export.export(Model(), (_tensor((1, 2, 8, 8)),))
    assert "gpupool.max_pool" in str(program.graph)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer).module()
    t = _tensor((1, 2, 8, 8), seed=3)
    values, indices = F.max_pool2d(t, 2, return_indices=True)
    got = loaded(t)
    torch.testing.assert_close(got[0], F.avg_pool2d(values, 2, padding=1,
                                                    count_include_pad=False) * 2)
    assert torch.equal(got[1], indices)


def test_vmap_equals_the_batch():
    t = _tensor((3, 2, 4, 6, 6))
    values, indices = torch.func.vmap(lambda a: gpupool.max_pool(a, 2, return_indices=True),
                                      in_dims=1)(t)
    want_values, want_indices = F.max_pool2d(t.movedim(1, 0).flatten(0, 1), 2,
                                             return_indices=True)
    assert torch.equal(values.flatten(0, 1), want_values)
    assert torch.equal(indices.flatten(0, 1), want_indices)


def test_func_grad_is_pytorchs_own_error():
    """PyTorch's torch.func.grad does not take custom operators' autograd formulas: its own
    error, never a silent result."""
    with pytest.raises(RuntimeError, match="functorch transforms"):
        torch.func.grad(lambda t: gpupool.avg_pool(t, 2).sum())(_tensor((1, 1, 4, 4)))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_jit_trace_is_a_clear_error():
    """torch.jit.trace had frozen the result as a constant."""
    with pytest.raises(TypeError, match="gpupool.max_pool: torch.jit.trace"):
        torch.jit.trace(lambda t: gpupool.max_pool(t, 2), (_tensor((1, 1, 4, 4)),))


@pytest.mark.parametrize("name", ["max_pool", "avg_pool", "adaptive_max_pool"])
def test_channels_last_runs_nhwc_in_place_and_stays_channels_last(monkeypatch, name):
    t = _tensor((2, 3, 8, 6)).to(memory_format=torch.channels_last).requires_grad_()
    seen = []
    op = getattr(gpupool.ops, name)

    def spy(a, *args, **kwargs):
        seen.append((kwargs["layout"], a.flags.c_contiguous,
                     np.shares_memory(a, t.detach().numpy())))
        return op(a, *args, **kwargs)
    monkeypatch.setattr(gpupool.ops, name, spy)
    ours, theirs = {
        "max_pool": (lambda a: gpupool.max_pool(a, 3, 2, 1), lambda a: F.max_pool2d(a, 3, 2, 1)),
        "avg_pool": (lambda a: gpupool.avg_pool(a, 2, count_include_pad=True),
                     lambda a: F.avg_pool2d(a, 2)),
        "adaptive_max_pool": (lambda a: gpupool.adaptive_max_pool(a, (3, 2)),
                              lambda a: F.adaptive_max_pool2d(a, (3, 2))),
    }[name]
    y = ours(t)
    assert seen == [("NHWC", True, True)]  # the NHWC path on t's own memory
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    want = theirs(t.detach())
    torch.testing.assert_close(y.detach(), want, rtol=0, atol=1e-12)
    g = _tensor(tuple(y.shape), seed=1)
    (gx,) = torch.autograd.grad(y, t, g)
    (want_gx,) = torch.autograd.grad(theirs(t), t, g)
    torch.testing.assert_close(gx, want_gx, rtol=0, atol=1e-12)
    assert gx.is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        assert ours(t).is_contiguous(memory_format=torch.channels_last)


def test_gradient_ignores_lists_mutated_after_the_forward():
    """gh-34: the gradient read the caller's lists at backward time (``ks[:] = [1, 1]``
    between forward and backward changed t.grad)."""
    a = np.random.default_rng(9).standard_normal((1, 2, 6, 6))
    t = torch.tensor(a, requires_grad=True)
    ks, pad = [2, 2], [1, 1]
    y = gpupool.avg_pool(t, ks, 1, pad)
    ks[:], pad[:] = [1, 1], [0, 0]
    g = _tensor(tuple(y.shape), seed=2)
    y.backward(g)
    reference = torch.tensor(a, requires_grad=True)
    F.avg_pool2d(reference, 2, 1, 1, count_include_pad=False).backward(g)
    torch.testing.assert_close(t.grad, reference.grad, rtol=0, atol=1e-12)


def test_tracked_eager_call_skips_the_dispatcher():
    """A tensor that requires grad, in eager mode, runs the operator's function and formula as
    an ``autograd.Function`` of its own (the dispatcher cost about 100 us a call more), with
    PyTorch's gradient, and so does the formula's operator; through ``torch.ops.gpupool`` the
    dispatcher's node."""
    t = _tensor((1, 2, 6, 6), requires_grad=True)
    y = gpupool.avg_pool(t, 2, count_include_pad=True)
    assert type(y.grad_fn).__name__ == "gpupool_avg_poolBackward"
    z = OPS.avg_pool(t, [2, 2], [2, 2], [0, 0, 0, 0], "", [1, 1], False, True, None, "NCHW")
    assert "GeneratedBackwardFor" in type(z.grad_fn).__name__
    g = _tensor(tuple(y.shape), seed=1, requires_grad=True)
    (gx,) = torch.autograd.grad(y, t, g, create_graph=True)
    (want,) = torch.autograd.grad(F.avg_pool2d(t, 2), t, g)
    torch.testing.assert_close(gx, want, rtol=0, atol=1e-12)
    assert type(gx.grad_fn).__name__ == "gpupool_avg_pool_backwardBackward"  # the formula too
