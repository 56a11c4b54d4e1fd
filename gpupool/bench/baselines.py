"""The baselines, run on the same data as gpupool: PyTorch (CPU or GPU), onnxruntime (CPU)
and plain CuPy (GPU). Each ``*_call`` gives ``(callable, None)``, or ``(None, reason)`` when
the baseline cannot run the case; torch and onnxruntime are imported only when called."""
from __future__ import annotations

import os

import numpy as np

from .cases import BACKWARD_OPS, Case, make_grad


def with_batch(case: Case, x):
    """``x`` with its N axis, as the baselines take it: a view with N = 1 prepended for an
    unbatched case, else ``x`` itself."""
    return x if case.batched else x[None]


def baseline_values(case: Case, out) -> np.ndarray:
    """A baseline's result as NumPy values in the case's own layout and shape: the
    values of a (values, indices) pair, a PyTorch tensor's NCHW view back in NHWC, and no
    N axis for an unbatched case."""
    out = out[0] if isinstance(out, (tuple, list)) else out
    if hasattr(out, "movedim"):  # a PyTorch tensor
        out = (out.movedim(1, -1) if case.layout == "NHWC" else out).detach().cpu().numpy()
    elif hasattr(out, "get"):  # a CuPy array
        out = out.get()
    return out if case.batched else out[0]


def torch_modules():
    """``(torch, torch.nn.functional)``, or ``(None, None)`` where PyTorch is not installed."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None, None
    return torch, F


def torch_call(case: Case, x, device: str, requires_grad: bool = False):
    """PyTorch on the same data (NCHW logical tensor; channels_last for NHWC), or
    (None, reason); ``requires_grad``: a forward op on a tensor that requires grad."""
    torch, F = torch_modules()
    if torch is None:
        return None, "not installed"
    if case.op in ("qmax", "qavg") or (case.op in BACKWARD_OPS and len(case.kernel) != 2):
        return None, "no such op"
    if device == "cuda" and not torch.cuda.is_available():
        return None, "built without CUDA or no GPU for it"
    t = torch.as_tensor(with_batch(case, x), device=device)
    if requires_grad:
        if case.op in BACKWARD_OPS:
            return None, "a backward op"
        t.requires_grad_()
    nd = len(case.kernel)
    if case.layout == "NHWC":
        t = t.movedim(-1, 1)  # a channels_last view: the same memory as x
    if case.op in BACKWARD_OPS:
        return _torch_backward(torch, F, case, t), None
    if case.op == "max":
        f = getattr(F, f"max_pool{nd}d")
        k, s = (case.kernel[0], (case.stride or case.kernel)[0]) if nd == 1 else (case.kernel, case.stride)
        return (lambda: f(t, k, s, case.padding, return_indices=case.indices)), None
    if case.op == "avg":
        f = getattr(F, f"avg_pool{nd}d")
        k, s = (case.kernel[0], (case.stride or case.kernel)[0]) if nd == 1 else (case.kernel, case.stride)
        return (lambda: f(t, k, s, case.padding, count_include_pad=False)), None
    if case.op == "lp":  # PyTorch omits the abs: the same for an even p
        if case.p % 2 or case.padding:
            return None, "odd p or padding (PyTorch's LpPool has neither abs nor padding)"
        f = getattr(F, f"lp_pool{nd}d")
        return (lambda: f(t, case.p, case.kernel, case.stride)), None
    if case.op == "gavg":
        return (lambda: F.adaptive_avg_pool2d(t, 1)), None
    if case.op == "amax":
        return (lambda: F.adaptive_max_pool2d(t, case.output_size)), None
    return (lambda: F.adaptive_avg_pool2d(t, case.output_size)), None


def _torch_backward(torch, F, case: Case, t):
    """PyTorch's own backward kernel of the case's 2-d pooling of ``t`` (the one autograd
    runs), on the gradient :func:`~gpupool.bench.cases.make_grad` gives for its output."""
    aten = torch.ops.aten

    def grad(y):  # the gradient in the case's layout, as a tensor shaped as y (NCHW)
        if case.layout == "NHWC":
            return torch.as_tensor(make_grad(case, tuple(y.movedim(1, -1).shape)),
                                   device=t.device).movedim(-1, 1)
        return torch.as_tensor(make_grad(case, tuple(y.shape)), device=t.device)
    if case.op == "gavg_bwd":
        g = grad(F.adaptive_avg_pool2d(t, 1))
        return lambda: aten._adaptive_avg_pool2d_backward(g, t)
    k, s, p = list(case.kernel), list(case.stride or case.kernel), [case.padding] * 2
    if case.op == "max_bwd":
        y, indices = F.max_pool2d(t, k, s, p, return_indices=True)
        g = grad(y)
        return lambda: aten.max_pool2d_with_indices_backward(g, t, k, s, p, [1, 1], False,
                                                             indices)
    g = grad(F.avg_pool2d(t, k, s, p, count_include_pad=False))
    return lambda: aten.avg_pool2d_backward(g, t, k, s, p, False, False, None)


def onnxruntime_call(case: Case, x):
    """onnxruntime CPU on the same data, or (None, reason)."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None, "not installed"
    if case.layout == "NHWC":
        return None, "no NHWC pooling op"
    if case.op in ("aavg", "amax", "qavg", *BACKWARD_OPS):
        return None, "no such op"
    nd = len(case.kernel)
    xb = np.ascontiguousarray(with_batch(case, x))
    elem = TensorProto.INT8 if case.dtype == "int8" else (
        TensorProto.FLOAT16 if case.dtype == "float16" else TensorProto.FLOAT)
    if case.op == "gavg":
        node = helper.make_node("GlobalAveragePool", ["X"], ["Y"])
    else:
        attrs = dict(kernel_shape=list(case.kernel), strides=list(case.stride or case.kernel),
                     pads=[case.padding] * (2 * nd))
        if case.op == "lp":
            attrs["p"] = int(case.p)
        node = helper.make_node({"max": "MaxPool", "qmax": "MaxPool", "lp": "LpPool"}.get(
                                    case.op, "AveragePool"),
                                ["X"], ["Y", "I"] if case.indices else ["Y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("X", elem, xb.shape)],
                              [helper.make_tensor_value_info(name, type_, None) for name, type_
                               in (("Y", elem), ("I", TensorProto.INT64))[:1 + case.indices]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count() or 1
    opts.inter_op_num_threads = 1
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - an unsupported type is a missing baseline
        return None, f"unsupported: {str(e)[:60]}"
    feed = {"X": xb}
    return (lambda: sess.run(None, feed)[0]), None


def cupy_call(case: Case, x):
    """Plain CuPy doing the same pooling: a reshape + reduction when k == s and there is no
    padding, else for max a ``cupyx.scipy.ndimage`` filter (padding with the dtype's lowest
    value, which never wins) + slicing; or (None, reason): ndimage's mean counts the padding,
    where gpupool's default divides by the valid taps. The leading axes (N, as
    :func:`with_batch` gives it, and C) are kept."""
    if case.layout != "NCHW" or case.op in ("qavg", "aavg", "amax", "lp", *BACKWARD_OPS):
        return None, "no plain-CuPy equivalent"
    x = with_batch(case, x)
    nd = len(case.kernel)
    lead, spatial = x.shape[:-nd], x.shape[-nd:]
    if case.op == "gavg":
        return (lambda: x.mean(axis=tuple(range(-nd, 0)), keepdims=True)), None
    k, s = case.kernel, case.stride or case.kernel
    if k == s and case.padding == 0 and all(i % kk == 0 for i, kk in zip(spatial, k)):
        split = lead + tuple(v for i, kk in zip(spatial, k) for v in (i // kk, kk))
        axes = tuple(len(lead) + 2 * a + 1 for a in range(nd))
        red = "max" if case.op in ("max", "qmax") else "mean"
        return (lambda: getattr(x.reshape(split), red)(axis=axes)), None
    if case.op not in ("max", "qmax"):
        return None, "no plain-CuPy equivalent (ndimage's mean counts the padding)"
    try:
        from cupyx.scipy import ndimage
    except ImportError as e:
        return None, f"cupyx.scipy.ndimage not importable ({e})"
    if any(case.padding > kk // 2 for kk in k):
        return None, "no plain-CuPy equivalent (a window starting before ndimage's first)"
    size = (1,) * len(lead) + k
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    # window o starts at o*s - p and ndimage centres a window of k at its start + k // 2
    sl = (Ellipsis,) + tuple(slice(kk // 2 - case.padding, kk // 2 - case.padding + ss * (
        (i + 2 * case.padding - kk) // ss) + 1, ss) for i, kk, ss in zip(spatial, k, s))
    return (lambda: ndimage.maximum_filter(x, size=size, mode="constant", cval=lowest)[sl]), None

