"""Checking a gpupool result before it is timed: against another computation of the same case
(the NumPy backend, a baseline) or against an independent float64 NumPy reference."""
from __future__ import annotations

import math

import numpy as np

from .cases import BACKWARD_OPS, Case, make_grad


def check_values(got, want, dtype: str) -> str:
    """Whether ``got`` matches ``want``: "ok" (exactly for int8, else within the dtype's
    tolerance) or "FAILED: ..." saying how it differs."""
    if got.shape != want.shape:
        return f"FAILED: shape {got.shape} vs {want.shape}"
    exact = dtype == "int8"
    tol = {"float16": 2e-3, "float32": 1e-5, "float64": 1e-12}.get(dtype, 0)
    ok = np.array_equal(got, want) if exact else np.allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol, equal_nan=True)
    return "ok" if ok else "FAILED: values differ"


def check_summary(checks: dict) -> str:
    """One line for a row's checks: "ok (vs a, b)", else each failed one with its name."""
    failed = [f"{v} (vs {name})" for name, v in checks.items() if v != "ok"]
    return "; ".join(failed) if failed else f"ok (vs {', '.join(checks)})"


def reference_values(case: Case, x) -> np.ndarray:
    """The case computed independently of gpupool: float64 (exact for int8 codes) over
    ``np.pad`` + sliding-window views, for checking cases that no baseline runs."""
    nd = len(case.kernel)
    a = np.asarray(x).astype(np.float64)
    if case.layout == "NHWC":
        a = np.moveaxis(a, -1, -nd - 1)
    axes = tuple(range(a.ndim - nd, a.ndim))
    if case.op in BACKWARD_OPS:
        r = _backward_reference(case, a, axes)
    elif case.op == "gavg":
        r = a.mean(axis=axes, keepdims=True)
    elif case.op in ("aavg", "amax"):  # window i spans [floor(i*I/O), ceil((i+1)*I/O))
        r = np.empty(a.shape[:-nd] + tuple(case.output_size))
        for pos in np.ndindex(*case.output_size):
            win = tuple(slice(i * size // o, -(-(i + 1) * size // o))
                        for i, size, o in zip(pos, a.shape[-nd:], case.output_size))
            part = a[(...,) + win]
            r[(...,) + pos] = (part.max if case.op == "amax" else part.mean)(axis=axes)
    else:
        kernel, stride, pad = case.kernel, case.stride or case.kernel, case.padding
        is_max = case.op in ("max", "qmax")
        padded = np.pad(a, [(0, 0)] * (a.ndim - nd) + [(pad, pad)] * nd,
                        constant_values=-np.inf if is_max else np.nan)
        win = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=axes)
        win = win[(...,) + tuple(slice(None, None, st) for st in stride) + (slice(None),) * nd]
        taps = tuple(range(win.ndim - nd, win.ndim))
        if is_max:
            r = win.max(axis=taps)
        elif case.op == "lp":
            r = np.nansum(np.abs(win) ** case.p, axis=taps) ** (1 / case.p)
        else:
            r = np.nanmean(win, axis=taps)  # NaN = padding
        if case.op == "qavg":  # default scales: zp + round half away from zero, zp = 0
            r = np.clip(np.sign(r) * np.floor(np.abs(r) + 0.5), -128, 127)
    return np.moveaxis(r, -nd - 1, -1) if case.layout == "NHWC" else r


def _backward_reference(case: Case, a, axes) -> np.ndarray:
    """The gradient of ``a`` (NCHW, float64) through the case's forward pooling, for the
    gradient :func:`~gpupool.bench.cases.make_grad` gives: each window's gradient to its first
    maximum, or spread evenly over its valid taps; the global average's over the plane."""
    nd = len(axes)
    grad_shape = a.shape[:-nd] + (1,) * nd
    if case.op == "gavg_bwd":
        g = _grad_values(case, grad_shape)
        return np.broadcast_to(g / math.prod(a.shape[-nd:]), a.shape)
    kernel, stride, pad = case.kernel, case.stride or case.kernel, case.padding
    is_max = case.op == "max_bwd"
    padded = np.pad(a, [(0, 0)] * (a.ndim - nd) + [(pad, pad)] * nd,
                    constant_values=-np.inf if is_max else np.nan)
    win = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=axes)
    win = win[(...,) + tuple(slice(None, None, st) for st in stride) + (slice(None),) * nd]
    out = win.shape[a.ndim - nd:a.ndim]
    taps = win.reshape(win.shape[:a.ndim] + (-1,))
    if is_max:
        weight = np.zeros(taps.shape)
        np.put_along_axis(weight, taps.argmax(axis=-1)[..., None], 1.0, axis=-1)
    else:
        valid = ~np.isnan(taps)
        weight = valid / valid.sum(axis=-1, keepdims=True)
    share = (_grad_values(case, win.shape[:a.ndim])[..., None] * weight).reshape(win.shape)
    grad = np.zeros(padded.shape)
    for tap in np.ndindex(*kernel):
        at = tuple(slice(t, t + st * (o - 1) + 1, st) for t, st, o in zip(tap, stride, out))
        grad[(...,) + at] += share[(...,) + tap]
    return grad[(...,) + tuple(slice(pad, pad + n) for n in a.shape[-nd:])]


def _grad_values(case: Case, nchw_shape) -> np.ndarray:
    """The case's gradient (``make_grad``, in its layout) as float64 of an NCHW shape."""
    nd = len(case.kernel)
    if case.layout == "NHWC":
        shape = nchw_shape[:-nd - 1] + nchw_shape[-nd:] + nchw_shape[-nd - 1:-nd]
        return np.moveaxis(make_grad(case, shape).astype(np.float64), -1, -nd - 1)
    return make_grad(case, nchw_shape).astype(np.float64)
