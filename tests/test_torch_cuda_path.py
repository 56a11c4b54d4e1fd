"""The CUDA side of gpupool's PyTorch operators, on the CPU executor's stand-in CuPy: a
training step's max gradients make no host transfer, and every launch runs on the caller's
PyTorch stream.

PyTorch here has no CUDA, so no CUDA tensor exists: these tests run the array-level calls the
operators make on a GPU (the forward with indices, the backward from those indices) on
stand-in CuPy arrays, and the stream the operators make current for a tensor on a CUDA device
(``torch.cuda.current_stream`` answered by the test). What they do not run is PyTorch's own
side: its allocation of the outputs and the DLPack hand-over of CUDA tensors.
"""
from __future__ import annotations

import types

import numpy as np
import pytest

import conftest
import gpupool
from gpupool import gradients

torch = pytest.importorskip("torch")
pytest.importorskip("gpupool.interop.torch_ops")  # the operators: the first tensor loads them
torch_tensors = pytest.importorskip("gpupool.interop.torch_tensors")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(conftest.GPU_RUNTIME != "executor",
                                 reason="spies on the CPU executor's stand-in CuPy")]


@pytest.fixture
def cupy():
    import cupy
    return cupy


@pytest.fixture
def host_reads(cupy, monkeypatch):
    """Every read of device memory by the host (a sync on a GPU), by what read it."""
    reads = []
    for name in ("get", "min", "max", "item", "__bool__", "__int__", "__float__", "__index__"):
        method = getattr(cupy.ndarray, name)

        def spy(self, *args, _method=method, _name=name, **kwargs):
            reads.append(_name)
            return _method(self, *args, **kwargs)
        monkeypatch.setattr(cupy.ndarray, name, spy)
    return reads


@pytest.fixture
def launch_streams(cupy, monkeypatch):
    """The stream of every kernel launch."""
    streams = []
    call = cupy.cuda.function.Function.__call__

    def spy(self, grid, block, args, shared_mem=0, stream=None):
        streams.append(stream or cupy.cuda.get_current_stream())
        return call(self, grid, block, args, shared_mem, stream)
    monkeypatch.setattr(cupy.cuda.function.Function, "__call__", spy)
    return streams


def _torch_stream(monkeypatch, pointer: int):
    """A CUDA tensor's device, with ``torch.cuda.current_stream`` answering ``pointer``."""
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: types.SimpleNamespace(cuda_stream=pointer))
    return types.SimpleNamespace(device=torch.device("cuda", 0))


@pytest.mark.parametrize("op", ["max_pool", "adaptive_max_pool"])
def test_training_step_makes_no_host_transfer_and_runs_on_the_callers_stream(
        cupy, monkeypatch, host_reads, launch_streams, op):
    """gh-33: every autograd backward of a max checked the indices it had saved itself
    (three device-to-host syncs per call on a GPU), and launches went to CuPy's current
    stream, not PyTorch's."""
    tensor = _torch_stream(monkeypatch, pointer=4242)
    with torch_tensors.stream(tensor) as caller:
        assert caller.ptr == 4242 and cupy.cuda.get_current_stream() is caller
        x = cupy.asarray(np.random.default_rng(0).standard_normal((2, 3, 8, 8)), np.float32)
        if op == "max_pool":
            y, indices = gpupool.max_pool(x, 3, 2, 1, return_indices=True)
            spec = gpupool.grad_spec.window_grad_spec(
                "max_pool_backward", "max", y.shape, "float32", x.shape, 3, 2, 1, 1, False,
                "NCHW", index_shape=indices.shape, index_dtype="int64")
        else:
            y, indices = gpupool.adaptive_max_pool(x, (3, 3), return_indices=True)
            spec = gpupool.grad_spec.adaptive_grad_spec(
                "adaptive_max_pool_backward", "max", y.shape, "float32", x.shape, (3, 3),
                "NCHW", index_shape=indices.shape, index_dtype="int64")
        grad = cupy.ones(y.shape, np.float32)
        gx = gradients.max_backward_of_own_indices(grad, indices, spec)
        assert host_reads == []
        assert launch_streams and all(s is caller for s in launch_streams)
        # the public backward op keeps its check of indices it did not make: host reads
        public = (gpupool.max_pool_backward(grad, indices, x.shape, 3, 2, 1) if op == "max_pool"
                  else gpupool.adaptive_max_pool_backward(grad, indices, x.shape, (3, 3)))
        assert host_reads
    caller.synchronize()
    np.testing.assert_array_equal(gx.get(), public.get())


def test_autograd_takes_the_max_gradient_from_its_own_indices(monkeypatch):
    """The operators' autograd formula runs the unchecked backward (the public op's check is
    not called); on the CPU, where the call is the same as on a GPU."""
    called = []
    own = gradients.max_backward_of_own_indices
    monkeypatch.setattr(gradients, "max_backward_of_own_indices",
                        lambda *a, **k: called.append("own") or own(*a, **k))
    public = gradients.max_pool_backward
    monkeypatch.setattr(gradients, "max_pool_backward",
                        lambda *a, **k: called.append("public") or public(*a, **k))
    t = torch.ones((1, 2, 4, 4), requires_grad=True)
    gpupool.max_pool(t, 2).sum().backward()
    assert called == ["own"]
