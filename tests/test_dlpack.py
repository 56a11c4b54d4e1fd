"""PyTorch tensors and JAX arrays in the float ops, through DLPack: values against
``tests/reference.py``, result types, dtypes and devices, no copy of the input or of the
result (seen through a spy on the backend implementation), ``out=``, ``max_unpool``,
non-contiguous and empty tensors, and the errors."""
from __future__ import annotations

import re

import numpy as np
import pytest

import gpupool
import gpupool.interop.dlpack
import gpupool.ops
import reference as R

RNG = np.random.default_rng(7)
TOL = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-12}

# op name -> (call on a tensor/array, reference values on a NumPy array)
OPS = {
    "max_pool": (lambda x: gpupool.max_pool(x, 3, 2, 1),
                 lambda a: R.max_pool(a, 3, 2, 1)[0]),
    "avg_pool": (lambda x: gpupool.avg_pool(x, 2, 1, ((0, 1), (1, 0)), count_include_pad=True),
                 lambda a: R.avg_pool(a, 2, 1, ((0, 1), (1, 0)), count_include_pad=True)),
    "lp_pool": (lambda x: gpupool.lp_pool(x, 2, 3, stride=2),
                lambda a: R.lp_pool(a, 2, 3, 2)),
    "global_avg_pool": (lambda x: gpupool.global_avg_pool(x),
                        lambda a: R.global_avg_pool(a)),
    "global_max_pool": (lambda x: gpupool.global_max_pool(x),
                        lambda a: R.global_max_pool(a)),
    "adaptive_avg_pool": (lambda x: gpupool.adaptive_avg_pool(x, (3, 2)),
                          lambda a: R.adaptive_avg_pool(a, (3, 2))),
    "adaptive_max_pool": (lambda x: gpupool.adaptive_max_pool(x, (3, 2)),
                          lambda a: R.adaptive_max_pool(a, (3, 2))[0]),
}
MAX_OPS = ["max_pool", "global_max_pool", "adaptive_max_pool"]


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def jax():
    return pytest.importorskip("jax")


@pytest.fixture
def seen(monkeypatch):
    """Every call of a backend implementation, as ``(x, result, indices)``: the arrays the
    backend really read and wrote."""
    calls = []
    real = gpupool.backends.load

    class Spy:
        def __init__(self, backend):
            self.backend = backend

        def __getattr__(self, name):
            return getattr(self.backend, name)

        def prepare_window(self, spec):
            return self.recorded(self.backend.prepare_window(spec))

        @property
        def adaptive(self):
            return self.recorded(self.backend.adaptive)

        @staticmethod
        def recorded(impl):
            def run(x, spec, result, indices):
                calls.append((x, result, indices))
                return impl(x, spec, result, indices)
            return run
    monkeypatch.setattr(gpupool.backends, "load", lambda name: Spy(real(name)))
    # a fresh plan cache: a plan cached before would bypass the spy
    monkeypatch.setattr(gpupool.plans, "_plans", type(gpupool.plans._plans)())
    return calls


def address(a) -> int:
    return a.__array_interface__["data"][0]


def message(exc, func, *fragments):
    """``pytest.raises`` that also checks the message names ``gpupool.<func>`` and every
    fragment."""
    pattern = "".join(f"(?=.*{re.escape(f)})" for f in (f"gpupool.{func}",) + fragments)
    return pytest.raises(exc, match=re.compile(pattern, re.S))


def data(dtype, shape=(2, 3, 7, 6)):
    """Distinct values (no ties), exact in every dtype, in random order."""
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return RNG.integers(max(info.min, -100), min(info.max, 100), shape).astype(dtype)
    return (RNG.permutation(int(np.prod(shape))).reshape(shape) / 8 - 10).astype(dtype)


# ----------------------------------------------------------------------------- PyTorch, CPU

@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op", list(OPS))
def test_torch_values_type_dtype_device(torch, op, dtype):
    a = data(dtype)
    t = torch.tensor(a)
    result = OPS[op][0](t)
    assert type(result) is torch.Tensor
    assert result.dtype == t.dtype and result.device == t.device
    np.testing.assert_allclose(result.numpy().astype(np.float64), OPS[op][1](a),
                               rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64"])
@pytest.mark.parametrize("op", MAX_OPS)
def test_torch_integer_max(torch, op, dtype):
    a = data(dtype)
    result = OPS[op][0](torch.tensor(a))
    assert result.dtype == getattr(torch, dtype)
    np.testing.assert_array_equal(result.numpy(), OPS[op][1](a))


@pytest.mark.parametrize("op", ["max_pool", "adaptive_max_pool"])
def test_torch_indices_are_int64_tensors(torch, op):
    a = data("float32")
    t = torch.tensor(a)
    if op == "max_pool":
        values, indices = gpupool.max_pool(t, 3, 2, 1, return_indices=True)
        want_values, want_indices = R.max_pool(a, 3, 2, 1)
    else:
        values, indices = gpupool.adaptive_max_pool(t, (3, 2), return_indices=True)
        want_values, want_indices = R.adaptive_max_pool(a, (3, 2))
    assert type(indices) is torch.Tensor and indices.dtype == torch.int64
    np.testing.assert_array_equal(values.numpy(), want_values)
    np.testing.assert_array_equal(indices.numpy(), want_indices)


def test_torch_input_and_results_are_not_copied(torch, seen):
    t = torch.tensor(data("float32"))
    values, indices = gpupool.max_pool(t, 2, return_indices=True)
    (x, result, idx), = seen
    assert address(x) == t.data_ptr() and x.shape == tuple(t.shape)
    assert values.data_ptr() == address(result)
    assert indices.data_ptr() == address(idx)


@pytest.mark.parametrize("view", ["transposed", "sliced", "expanded"])
def test_torch_non_contiguous_input_is_read_in_place(torch, seen, view):
    base = torch.tensor(data("float64", (2, 3, 8, 9)))
    t = {"transposed": lambda: base.transpose(2, 3),
         "sliced": lambda: base[:, 1:, 1:, ::2],
         "expanded": lambda: base[:1, :1].expand(2, 3, 8, 9)}[view]()
    assert not t.is_contiguous()
    result = gpupool.avg_pool(t, 3, 2, 1)
    (x, _, _), = seen
    assert address(x) == t.data_ptr()
    assert x.strides == tuple(s * t.element_size() for s in t.stride())
    np.testing.assert_allclose(result.numpy(), R.avg_pool(t.numpy(), 3, 2, 1), rtol=1e-12)


def test_torch_zero_size(torch):
    t = torch.empty((0, 3, 4, 4))
    values, indices = gpupool.max_pool(t, 2, return_indices=True)
    assert type(values) is torch.Tensor and values.shape == (0, 3, 2, 2)
    assert values.dtype == torch.float32 and indices.dtype == torch.int64
    assert gpupool.global_avg_pool(torch.empty((2, 0, 3, 3))).shape == (2, 0, 1, 1)


def test_torch_out_is_written_in_place_and_returned(torch, seen):
    a = data("float32")
    out = torch.full((2, 3, 4, 3), 99.0)
    result = gpupool.max_pool(torch.tensor(a), 3, 2, 1, out=out)
    assert result is out
    assert address(seen[0][1]) == out.data_ptr()
    np.testing.assert_array_equal(out.numpy(), R.max_pool(a, 3, 2, 1)[0])


def test_torch_out_with_indices(torch):
    a = data("float32")
    out = torch.empty((2, 3, 3, 2))
    values, indices = gpupool.adaptive_max_pool(torch.tensor(a), (3, 2), return_indices=True,
                                                out=out)
    assert values is out and indices.dtype == torch.int64
    want_values, want_indices = R.adaptive_max_pool(a, (3, 2))
    np.testing.assert_array_equal(out.numpy(), want_values)
    np.testing.assert_array_equal(indices.numpy(), want_indices)


def test_torch_max_unpool_round_trip(torch):
    a = data("float32", (2, 3, 6, 6))
    values, indices = gpupool.max_pool(torch.tensor(a), 2, return_indices=True)
    want = R.max_unpool(values.numpy(), indices.numpy(), 2)
    result = gpupool.max_unpool(values, indices, 2)
    assert type(result) is torch.Tensor and result.dtype == torch.float32
    np.testing.assert_array_equal(result.numpy(), want)
    by_keyword = gpupool.max_unpool(values, indices=indices, kernel_size=2)
    np.testing.assert_array_equal(by_keyword.numpy(), want)
    out = torch.empty((2, 3, 6, 6))
    assert gpupool.max_unpool(values, indices, 2, out=out) is out
    np.testing.assert_array_equal(out.numpy(), want)


# ----------------------------------------------------------------------------- PyTorch errors

@pytest.mark.parametrize("dtype", ["complex64", "bool", "float8_e4m3fn", "uint16"])
def test_torch_unsupported_dtype_is_a_type_error_before_any_work(torch, seen, dtype):
    t = torch.zeros((1, 1, 4, 4), dtype=getattr(torch, dtype))
    with message(TypeError, "max_pool", "x", dtype, "float32"):
        gpupool.max_pool(t, 2)
    assert seen == []


def test_torch_requires_grad_joins_the_autograd_graph(torch, seen):
    """A tensor that requires grad is pooled as part of the graph (values checked in
    tests/test_autograd.py); under no_grad, and detached, it is pooled untracked."""
    t = torch.ones((1, 1, 4, 4), requires_grad=True)
    result = gpupool.avg_pool(t, 2)
    assert result.requires_grad and result.grad_fn is not None
    assert result.tolist() == [[[[1.0, 1.0], [1.0, 1.0]]]]
    with torch.no_grad():
        untracked = gpupool.avg_pool(t, 2)
    assert not untracked.requires_grad and untracked.tolist() == [[[[1.0, 1.0], [1.0, 1.0]]]]
    assert address(seen[-1][0]) == t.data_ptr()  # still read in place
    assert gpupool.avg_pool(t.detach(), 2).tolist() == [[[[1.0, 1.0], [1.0, 1.0]]]]
    with message(TypeError, "max_unpool", "x requires grad", "x.detach()"):
        gpupool.max_unpool(t, torch.zeros((1, 1, 4, 4), dtype=torch.int64), 1)


def test_torch_integer_input_to_average_points_to_quantized(torch):
    with message(TypeError, "avg_pool", "x", "int32", "gpupool.quantized"):
        gpupool.avg_pool(torch.ones((1, 1, 4, 4), dtype=torch.int32), 2)


@pytest.mark.parametrize("make, exc, fragment", [
    (lambda torch: np.empty((1, 1, 2, 2), np.float32), TypeError, "numpy.ndarray"),
    (lambda torch: [[[[0.0, 0.0], [0.0, 0.0]]]], TypeError, "builtins.list"),
    (lambda torch: torch.empty((1, 1, 2, 2), dtype=torch.bfloat16), ValueError, "bfloat16"),
    (lambda torch: torch.empty((1, 1, 2, 2), requires_grad=True), TypeError, "out.detach()"),
    (lambda torch: torch.empty((1, 1, 2, 2), dtype=torch.float64), ValueError, "float64"),
    (lambda torch: torch.empty((1, 1, 3, 2)), ValueError, "(1, 1, 3, 2)"),
    (lambda torch: torch.empty((1, 1, 2, 2)).transpose(2, 3), ValueError, "C-contiguous"),
], ids=["numpy", "list", "bfloat16", "requires-grad", "dtype", "shape", "non-contiguous"])
def test_torch_out_rules(torch, make, exc, fragment):
    with message(exc, "max_pool", "out", fragment):
        gpupool.max_pool(torch.ones((1, 1, 4, 4)), 2, out=make(torch))


def _negative_views(torch, a):
    """Float tensors equal to ``a`` whose negative bit is set, as PyTorch makes them."""
    t = torch.tensor(a)
    imag = torch.complex(torch.zeros_like(t), -t).conj().imag  # -(-t), lazily
    return {"conj().imag": imag, "_neg_view": torch._neg_view(-t)}


@pytest.mark.parametrize("name", ["max_pool", "avg_pool", "lp_pool", "global_avg_pool",
                                  "adaptive_max_pool"])
def test_torch_negative_bit_input_is_resolved(torch, name):
    """Regression: DLPack drops PyTorch's negative bit, so a tensor with it (e.g. t.conj().imag
    of a complex t) was pooled as -t. Against torch's own pooling of the resolved tensor."""
    F = torch.nn.functional
    torch_op = {"max_pool": lambda t: F.max_pool2d(t, 3, 2, 1),
                "avg_pool": lambda t: F.avg_pool2d(t, 2, 1, 1, count_include_pad=True),
                "lp_pool": lambda t: F.lp_pool2d(t.abs(), 2, 2),
                "global_avg_pool": lambda t: F.adaptive_avg_pool2d(t, 1),
                "adaptive_max_pool": lambda t: F.adaptive_max_pool2d(t, (3, 2))}[name]
    ours = {"max_pool": lambda t: gpupool.max_pool(t, 3, 2, 1),
            "avg_pool": lambda t: gpupool.avg_pool(t, 2, 1, 1, count_include_pad=True),
            "lp_pool": lambda t: gpupool.lp_pool(t, 2, 2),
            "global_avg_pool": lambda t: gpupool.global_avg_pool(t),
            "adaptive_max_pool": lambda t: gpupool.adaptive_max_pool(t, (3, 2))}[name]
    a = data("float32", (2, 3, 6, 6)) - 20
    for how, t in _negative_views(torch, a).items():
        assert t.is_neg() and not t.is_conj(), how
        want = torch_op(t.resolve_neg())
        np.testing.assert_allclose(ours(t).numpy(), want.numpy(), rtol=1e-6, err_msg=how)
        assert t.is_neg(), how  # the input itself is left as it was


def test_torch_negative_bit_indices_are_resolved(torch):
    a = data("float32", (2, 3, 6, 6))
    values, indices = gpupool.max_pool(torch.tensor(a), 2, return_indices=True)
    negated = torch._neg_view(-indices)
    assert negated.is_neg()
    want = R.max_unpool(values.numpy(), indices.numpy(), 2)
    np.testing.assert_array_equal(gpupool.max_unpool(values, negated, 2).numpy(), want)


def test_torch_negative_bit_out_is_a_type_error(torch, seen):
    out = torch._neg_view(torch.zeros((1, 1, 2, 2)))
    with message(TypeError, "max_pool", "out", "negative bit"):
        gpupool.max_pool(torch.ones((1, 1, 4, 4)), 2, out=out)
    assert seen == []


def test_torch_out_must_not_overlap_the_input(torch):
    t = torch.ones((1, 1, 4, 4))
    with message(ValueError, "avg_pool", "out", "overlap"):
        gpupool.avg_pool(t, 2, out=t.view(-1)[:4].view(1, 1, 2, 2))


@pytest.mark.parametrize("make, exc, fragment", [
    (lambda torch, i: i.numpy(), TypeError, "numpy.ndarray"),
    (lambda torch, i: i.float(), TypeError, "float32"),
    (lambda torch, i: i[..., :1], ValueError, "shape"),
], ids=["numpy", "float", "shape"])
def test_torch_max_unpool_indices_rules(torch, make, exc, fragment):
    values, indices = gpupool.max_pool(torch.ones((1, 1, 4, 4)), 2, return_indices=True)
    with message(exc, "max_unpool", "indices", fragment):
        gpupool.max_unpool(values, make(torch, indices), 2)


def test_torch_tensor_without_a_dlpack_device_is_a_type_error(torch):
    with message(TypeError, "global_max_pool", "x", "torch.Tensor"):
        gpupool.global_max_pool(torch.ones((1, 1, 2, 2), device="meta"))
    with message(TypeError, "global_max_pool", "x", "torch.Tensor", "DLPack"):
        gpupool.global_max_pool(torch.ones((2, 2)).to_sparse())


class _MetalTensor:
    """A tensor of a library gpupool knows, on a device it does not run on."""
    __module__ = "torch"

    def __dlpack__(self, stream=None):
        raise AssertionError("never exported")

    def __dlpack_device__(self):
        return 8, 0


class _OtherLibraryTensor:
    def __dlpack__(self, stream=None):
        raise AssertionError("never exported")

    def __dlpack_device__(self):
        return 1, 0


def test_unsupported_device_is_a_type_error_naming_it():
    with message(TypeError, "max_pool", "x", "Metal:0", "CUDA"):
        gpupool.max_pool(_MetalTensor(), 2)


def test_dlpack_tensor_of_another_library_is_a_type_error():
    with message(TypeError, "lp_pool", "x", "_OtherLibraryTensor", "PyTorch"):
        gpupool.lp_pool(_OtherLibraryTensor(), 2, 2)


def test_non_array_message_names_tensors():
    with message(TypeError, "max_pool", "x", "PyTorch tensor", "JAX array", "builtins.dict"):
        gpupool.max_pool({"a": 1}, 2)


# ----------------------------------------------------------------------------- PyTorch, CUDA

def _cuda(torch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch")
    pytest.importorskip("cupy")
    return torch.device("cuda")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op", list(OPS))
def test_torch_cuda_values_type_device(torch, op, dtype):
    cuda = _cuda(torch)
    a = data(dtype)
    result = OPS[op][0](torch.tensor(a, device=cuda))
    assert type(result) is torch.Tensor and result.device.type == "cuda"
    assert result.dtype == getattr(torch, dtype)
    np.testing.assert_allclose(result.cpu().numpy().astype(np.float64), OPS[op][1](a),
                               rtol=TOL[dtype], atol=TOL[dtype])


def test_torch_cuda_no_copies_indices_and_out(torch, seen):
    cuda = _cuda(torch)
    a = data("float32")
    t = torch.tensor(a, device=cuda).transpose(2, 3)
    values, indices = gpupool.max_pool(t, 3, 2, 1, return_indices=True)
    (x, result, idx), = seen
    assert x.data.ptr == t.data_ptr()
    assert values.data_ptr() == result.data.ptr and indices.data_ptr() == idx.data.ptr
    assert indices.dtype == torch.int64 and indices.device == t.device
    want_values, want_indices = R.max_pool(a.transpose(0, 1, 3, 2), 3, 2, 1)
    np.testing.assert_array_equal(values.cpu().numpy(), want_values)
    np.testing.assert_array_equal(indices.cpu().numpy(), want_indices)
    out = torch.empty(tuple(values.shape), device=cuda)
    assert gpupool.max_pool(t, 3, 2, 1, out=out) is out
    np.testing.assert_array_equal(out.cpu().numpy(), want_values)
    unpooled = gpupool.max_unpool(values, indices, 3, 2, 1, output_size=t.shape[2:])
    assert unpooled.device == t.device
    want = R.max_unpool(want_values, want_indices, 3, 2, 1, output_size=tuple(t.shape[2:]))
    np.testing.assert_array_equal(unpooled.cpu().numpy(), want)


def test_torch_cuda_and_cpu_operands_do_not_mix(torch):
    cuda = _cuda(torch)
    with message(ValueError, "max_pool", "out", "CPU:0", "CUDA:0"):
        gpupool.max_pool(torch.ones((1, 1, 4, 4), device=cuda), 2,
                         out=torch.empty((1, 1, 2, 2)))
    values, indices = gpupool.max_pool(torch.ones((1, 1, 4, 4)), 2, return_indices=True)
    with message(ValueError, "max_unpool", "indices", "CUDA:0", "CPU:0"):
        gpupool.max_unpool(values, indices.to(cuda), 2)


# ----------------------------------------------------------------------------- JAX

def _index_dtype(jax):
    return np.int64 if jax.config.jax_enable_x64 else np.int32


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("op", list(OPS))
def test_jax_values_type_dtype(jax, op, dtype):
    a = data(dtype)
    x = jax.numpy.asarray(a)
    result = OPS[op][0](x)
    assert isinstance(result, jax.Array)
    assert result.dtype == np.dtype(dtype) and result.devices() == x.devices()
    np.testing.assert_allclose(np.asarray(result).astype(np.float64), OPS[op][1](a),
                               rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("op", MAX_OPS)
def test_jax_integer_max(jax, op):
    a = data("int8")
    result = OPS[op][0](jax.numpy.asarray(a))
    assert result.dtype == np.int8
    np.testing.assert_array_equal(np.asarray(result), OPS[op][1](a))


def test_jax_input_is_not_copied_and_indices_round_trip(jax, seen):
    a = data("float32", (2, 3, 6, 6))
    x = jax.numpy.asarray(a)
    values, indices = gpupool.max_pool(x, 2, return_indices=True)
    assert address(seen[0][0]) == x.unsafe_buffer_pointer()
    assert isinstance(indices, jax.Array) and indices.dtype == _index_dtype(jax)
    want_values, want_indices = R.max_pool(a, 2)
    np.testing.assert_array_equal(np.asarray(values), want_values)
    np.testing.assert_array_equal(np.asarray(indices), want_indices)
    result = gpupool.max_unpool(values, indices, 2)
    assert isinstance(result, jax.Array)
    np.testing.assert_array_equal(np.asarray(result), R.max_unpool(want_values, want_indices, 2))


def test_jax_zero_size(jax):
    result = gpupool.avg_pool(jax.numpy.zeros((0, 2, 4, 4)), 2)
    assert isinstance(result, jax.Array) and result.shape == (0, 2, 2, 2)


def test_jax_out_is_a_type_error(jax, seen):
    x = jax.numpy.ones((1, 1, 4, 4))
    with message(TypeError, "max_pool", "out", "immutable"):
        gpupool.max_pool(x, 2, out=jax.numpy.empty((1, 1, 2, 2)))
    assert seen == []


def test_jax_and_torch_do_not_mix(jax, torch):
    values, indices = gpupool.max_pool(jax.numpy.ones((1, 1, 4, 4)), 2, return_indices=True)
    with message(TypeError, "max_unpool", "indices", "torch.Tensor", "jax.Array"):
        gpupool.max_unpool(values, torch.from_dlpack(np.asarray(indices).copy()), 2)
    with message(TypeError, "max_pool", "out", "jax.Array", "torch.Tensor"):
        gpupool.max_pool(torch.ones((1, 1, 4, 4)), 2, out=jax.numpy.empty((1, 1, 2, 2)))


def test_jax_float8_is_a_type_error(jax, seen):
    with message(TypeError, "global_avg_pool", "x", "float8_e4m3fn"):
        gpupool.global_avg_pool(jax.numpy.ones((1, 1, 2, 2), jax.numpy.float8_e4m3fn))
    assert seen == []


def test_jax_traced_value_runs_through_a_callback(jax):
    """Under jit the float ops run (values checked in tests/test_jax.py); max_unpool
    still takes only concrete arrays."""
    x = jax.numpy.asarray(data("float32", (1, 1, 4, 4)))
    result = jax.jit(lambda x: gpupool.max_pool(x, 2))(x)
    assert isinstance(result, jax.Array)
    np.testing.assert_array_equal(np.asarray(result), R.max_pool(np.asarray(x), 2)[0])
    values, indices = gpupool.max_pool(x, 2, return_indices=True)
    with message(TypeError, "max_unpool", "x", "traced", "jax.jit"):
        jax.jit(lambda v: gpupool.max_unpool(v, indices, 2))(values)


def test_jax_indices_beyond_int32_are_refused_without_x64(jax, monkeypatch):
    if jax.config.jax_enable_x64:
        pytest.skip("JAX keeps int64 indices with x64")
    x = jax.numpy.asarray(data("float32", (1, 1, 4, 4)))  # the last window's index is >= 10
    monkeypatch.setattr(gpupool.interop.dlpack, "_INT32_MAX", 15)
    assert gpupool.max_pool(x, 2, return_indices=True)[1].dtype == np.int32
    monkeypatch.setattr(gpupool.interop.dlpack, "_INT32_MAX", 9)
    with message(ValueError, "max_pool", "return_indices", "does not fit", "jax_enable_x64"):
        gpupool.max_pool(x, 2, return_indices=True)
