"""Pooling semantics: argument validation, padding rules and output shapes.

Pure Python (no NumPy, no CuPy). Every public op normalises its arguments here into a frozen,
hashable spec; the backends take that spec and nothing else, and the CUDA backend uses it as
its kernel-cache key. Every error a user can trigger is raised here, so it is the same on every
backend.

Shape conventions (``nd`` spatial dims):
  * ``layout="NCHW"``: ``x.shape == lead + spatial``; every leading dim is a plane dim.
  * ``layout="NHWC"``: ``x.shape == lead + spatial + (C,)``.

String options (``padding``, ``layout``; in :mod:`gpupool.quantized` also ``rounding`` and
``dtype``) are matched case-insensitively: ``"same"``, ``"SAME"`` and ``"Same"`` are one
option (:func:`choice`).
"""
from __future__ import annotations

import functools
import math
import numbers
import operator
import sys
from dataclasses import dataclass

from .spec_cache import hash_once, memoized, state_without_hash

LAYOUTS = ("NCHW", "NHWC")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "uint8", "int16", "int32", "int64")
PADDING_STRINGS = ("valid", "same", "same_lower")
#: largest kernel size, stride, dilation, pad and divisor_override (the CUDA kernels take them
#: as int32)
WINDOW_PARAM_MAX = 2**31 - 1
#: (smallest normal, largest finite) of float32 and float64, the kernels' float scalars
FLOAT32_RANGE = (2.0**-126, 3.4028234663852886e38)
FLOAT64_RANGE = (sys.float_info.min, sys.float_info.max)
#: the float type of the scalars and accumulators of each float dtype's kernels
ACC_DTYPES = dict.fromkeys(("float16", "bfloat16", "float32"), "float32") | {"float64": "float64"}
#: largest output, in bytes (values, plus int64 indices where returned), counting at least one
#: plane: 2**48 bytes = 256 TiB, the 48-bit virtual address space of x86-64 and of CUDA GPUs.
#: No machine can allocate more, so a larger output is a geometry error, not an allocation.
OUTPUT_BYTES_MAX = 2**48
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1,
            "int16": 2, "int32": 4, "int64": 8}


def fail(func: str, message: str, exc: type = ValueError):
    raise exc(f"gpupool.{func}: {message}")


def is_int(v) -> bool:
    """A Python or NumPy integer (not a bool)."""
    if isinstance(v, bool):
        return False
    try:
        operator.index(v)
    except TypeError:
        return False
    return getattr(v, "ndim", 0) == 0


def check_bool(func: str, name: str, value) -> bool:
    """A bool or NumPy bool (``"False"``, ``0`` or ``None`` would be taken as a truth value)."""
    if type(value).__name__ not in ("bool", "bool_"):
        fail(func, f"{name}={value!r} must be a bool", TypeError)
    return bool(value)


def check_int(func: str, name: str, value, low: int, high: int, what: str) -> int:
    """A Python or NumPy int (not a bool) in [``low``, ``high``]; ``what`` names the range."""
    if not is_int(value):
        fail(func, f"{name}={value!r} must be an int", TypeError)
    if not low <= int(value) <= high:
        fail(func, f"{name}={value!r} is outside {what} [{low}, {high}]")
    return int(value)


def check_real(func: str, name: str, value, low: float, high: float, what: str) -> float:
    """A real number (not a bool) in [``low``, ``high``], compared exactly before it becomes a
    float64, so that no value overflows the conversion; ``what`` says why the range."""
    if type(value).__name__ in ("bool", "bool_") or not isinstance(value, numbers.Real):
        fail(func, f"{name}={value!r} must be a real number", TypeError)
    # a NumPy scalar as the Python number it holds (NumPy would cast the bounds to its type;
    # a long double, which no Python number holds, compares with them exactly as it is)
    exact = value.item() if type(value).__module__ == "numpy" else value
    if not low <= exact <= high:  # NaN fails too
        fail(func, f"{name}={value!r} must lie in [{low!r}, {high!r}] ({what})")
    return float(exact)


def _int_tuple(func: str, name: str, value, nd: int, minimum: int,
               maximum: int | None = None) -> tuple[int, ...]:
    """An int or a length-``nd`` sequence of ints, each in [``minimum``, ``maximum``]."""
    if is_int(value):
        values = (int(value),) * nd
    elif isinstance(value, (tuple, list)) and all(is_int(v) for v in value):
        values = tuple(int(v) for v in value)
        if len(values) != nd:
            fail(func, f"{name}={value!r} has {len(values)} entries, expected {nd} "
                        f"(one per spatial dim)")
    else:
        fail(func, f"{name}={value!r} must be an int or a tuple of {nd} ints", TypeError)
    if any(v < minimum for v in values):
        fail(func, f"{name}={value!r} must be >= {minimum} in every dim")
    if maximum is not None and any(v > maximum for v in values):
        fail(func, f"{name}={value!r} must be <= {maximum} (2**31 - 1) in every dim")
    return values


def _window_ints(func: str, name: str, value, nd: int, minimum: int) -> tuple[int, ...]:
    return _int_tuple(func, name, value, nd, minimum, WINDOW_PARAM_MAX)


def spatial_rank(func: str, size, name: str = "kernel_size") -> int:
    """Spatial rank implied by a kernel or output size (parameter ``name``): its length when a
    sequence, else 2."""
    if isinstance(size, (tuple, list)):
        if len(size) == 0:
            fail(func, f"{name}={size!r} must not be empty")
        return len(size)
    if is_int(size):
        return 2
    fail(func, f"{name}={size!r} must be an int or a tuple of ints", TypeError)


def choice(func: str, name: str, value, choices: tuple[str, ...]) -> str:
    """The entry of ``choices`` that the string ``value`` names, ignoring case (every string
    option follows this rule); anything else is a ``ValueError`` naming ``name``."""
    if isinstance(value, str):
        if value in choices:  # the canonical spelling: no search
            return value
        folded = value.casefold()
        for c in choices:
            if c.casefold() == folded:
                return c
    fail(func, f"{name}={value!r} is not one of {choices} (case-insensitive)")


def check_layout(func: str, layout) -> str:
    return choice(func, "layout", layout, LAYOUTS)


def check_dtype(func: str, dtype: str, *, integers: bool) -> str:
    """Float dtypes always; integer dtypes only where ``integers`` (max family)."""
    if dtype in FLOAT_DTYPES or (integers and dtype in INT_DTYPES):
        return dtype
    if dtype in INT_DTYPES:
        fail(func, f"x has dtype {dtype}, which is not supported: average/Lp pooling of "
                    f"integer data needs a scale, use gpupool.quantized", TypeError)
    allowed = FLOAT_DTYPES + (INT_DTYPES if integers else ())
    fail(func, f"x has dtype {dtype}, which is not supported (supported: "
                f"{', '.join(allowed)})", TypeError)


def _binary_size(n: int) -> str:
    for unit, shift in (("EiB", 60), ("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


def check_output_size(func: str, g: "Geometry", out_spatial, cause: str,
                      indices: bool = False) -> None:
    """The output of ``out_spatial`` must fit in :data:`OUTPUT_BYTES_MAX` bytes (values, plus
    int64 indices where returned), counting at least one plane so that an empty batch does not
    hide an absurd geometry. ``cause`` names the parameters that chose the size."""
    per_element = ITEMSIZE.get(g.dtype, 8) + (8 if indices else 0)
    nbytes = max(g.planes, 1) * math.prod(out_spatial) * per_element
    if nbytes > OUTPUT_BYTES_MAX:
        fail(func, f"{cause} would give output shape {g.with_spatial(tuple(out_spatial))}: "
                    f"{_binary_size(nbytes)} of {g.dtype}{' and int64 indices' if indices else ''}"
                    f", beyond the limit of 2**48 bytes (256 TiB) for one output")


@dataclass(frozen=True)
class Geometry:
    """Where the plane, spatial and channel dims of an input sit."""

    __hash__ = hash_once
    __getstate__ = state_without_hash

    func: str
    shape: tuple[int, ...]
    dtype: str
    layout: str
    nd: int

    @functools.cached_property
    def lead(self) -> tuple[int, ...]:
        return self.shape[:len(self.shape) - self.nd - (self.layout == "NHWC")]

    @functools.cached_property
    def spatial(self) -> tuple[int, ...]:
        start = len(self.lead)
        return self.shape[start:start + self.nd]

    @functools.cached_property
    def channels(self) -> int:
        """Size of the trailing channel dim for NHWC; 1 for NCHW."""
        return self.shape[-1] if self.layout == "NHWC" else 1

    @functools.cached_property
    def batch(self) -> int:
        """Number of leading (plane) positions: prod(lead)."""
        return math.prod(self.lead)

    @functools.cached_property
    def planes(self) -> int:
        """Independent spatial planes: prod(lead) * channels."""
        return self.batch * self.channels

    def with_spatial(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
        tail = (self.channels,) if self.layout == "NHWC" else ()
        return self.lead + tuple(spatial) + tail


def geometry(func: str, shape, dtype: str, layout, nd: int, *, integers: bool,
             allow_empty_spatial: bool = False) -> Geometry:
    """Validate rank, layout and dtype of an input of ``shape``."""
    layout = check_layout(func, layout)
    check_dtype(func, dtype, integers=integers)
    shape = tuple(int(s) for s in shape)
    need = nd + (layout == "NHWC")
    if len(shape) < need:
        fail(func, f"x of shape {shape} has rank {len(shape)}; {nd} spatial dims in layout "
                    f"{layout} need rank >= {need}")
    g = Geometry(func, shape, dtype, layout, nd)
    if not allow_empty_spatial and any(s == 0 for s in g.spatial):
        fail(func, f"x of shape {shape} has an empty spatial dim {g.spatial}")
    return g


def resolve_padding(func: str, padding, nd: int, spatial, kernel, stride, dilation
                    ) -> tuple[tuple[int, int], ...]:
    """Per spatial dim (begin, end) pads from any accepted padding form."""
    if isinstance(padding, str):
        mode = choice(func, "padding", padding, PADDING_STRINGS)
        if mode == "valid":
            return ((0, 0),) * nd
        pads = []
        for i, k, s, d in zip(spatial, kernel, stride, dilation):
            out = -(-i // s)
            total = max((out - 1) * s + d * (k - 1) + 1 - i, 0)
            small, large = total // 2, total - total // 2
            pads.append((small, large) if mode == "same" else (large, small))
        if any(p > WINDOW_PARAM_MAX for pair in pads for p in pair):
            fail(func, f"padding={padding!r} resolves to pads {tuple(pads)}, beyond "
                        f"{WINDOW_PARAM_MAX} (2**31 - 1)")
        return tuple(pads)
    if isinstance(padding, (tuple, list)) and padding and all(
            isinstance(p, (tuple, list)) for p in padding):
        if len(padding) != nd or any(len(p) != 2 for p in padding):
            fail(func, f"padding={padding!r} must hold {nd} (begin, end) pairs")
        flat = _window_ints(func, "padding", [v for p in padding for v in p], 2 * nd, 0)
        return tuple((flat[2 * i], flat[2 * i + 1]) for i in range(nd))
    sym = _window_ints(func, "padding", padding, nd, 0)
    return tuple((p, p) for p in sym)


def output_length(size: int, kernel: int, stride: int, pad: tuple[int, int], dilation: int,
                  ceil_mode: bool) -> int:
    """Pooled length of one dim (PyTorch ``pooling_output_shape_pad_lr``)."""
    begin, end = pad
    span = size + begin + end - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + begin:
        out -= 1
    return out


@dataclass(frozen=True)
class WindowSpec:
    """A sliding-window pooling (max, avg, lp) fully resolved."""

    __hash__ = hash_once
    __getstate__ = state_without_hash

    geom: Geometry
    op: str  # "max" | "avg" | "lp"
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    ceil_mode: bool
    out_spatial: tuple[int, ...]
    return_indices: bool = False
    count_include_pad: bool = False
    divisor_override: int | None = None
    p: float | None = None

    @functools.cached_property
    def out_shape(self) -> tuple[int, ...]:
        return self.geom.with_spatial(self.out_spatial)

    @functools.cached_property
    def covers_planes(self) -> bool:
        """Whether each plane has one window and its taps cover the whole plane (output size
        1, dilation 1, the window reaching the plane's end): a values-only max is then the
        plane's max (exact in any order)."""
        return all(o == 1 and d == 1 and k - pb >= n for o, d, k, (pb, _), n in zip(
            self.out_spatial, self.dilation, self.kernel, self.pads, self.geom.spatial))


def window_arguments(func: str, kernel_size, stride, padding, dilation):
    """``(kernel, stride, dilation, padding)`` validated without the input: ``padding`` as
    (begin, end) pairs per dim, or a padding string's canonical name."""
    nd = spatial_rank(func, kernel_size)
    kernel = _window_ints(func, "kernel_size", kernel_size, nd, 1)
    stride = kernel if stride is None else _window_ints(func, "stride", stride, nd, 1)
    dilation = _window_ints(func, "dilation", dilation, nd, 1)
    return kernel, stride, dilation, (choice(func, "padding", padding, PADDING_STRINGS)
                                      if isinstance(padding, str) else resolve_padding(
                                          func, padding, nd, None, kernel, stride, dilation))


@memoized
def window_spec(func: str, op: str, shape, dtype: str, kernel_size, stride, padding, dilation,
                ceil_mode, layout, *, return_indices=False, count_include_pad=False,
                divisor_override=None, p=None, integers=None) -> WindowSpec:
    """Validate a window pooling. ``integers``: whether integer dtypes are admitted (default:
    for max only; the quantized ops admit them for averages too)."""
    nd = spatial_rank(func, kernel_size)
    g = geometry(func, shape, dtype, layout, nd,
                 integers=(op == "max") if integers is None else integers)
    kernel, stride, dilation, given = window_arguments(func, kernel_size, stride, padding, dilation)
    pads = resolve_padding(func, given, nd, g.spatial, kernel, stride, dilation)
    ceil_mode = check_bool(func, "ceil_mode", ceil_mode)
    return_indices = check_bool(func, "return_indices", return_indices)
    count_include_pad = check_bool(func, "count_include_pad", count_include_pad)
    if divisor_override is not None:
        divisor_override = check_int(func, "divisor_override", divisor_override, 1,
                                     WINDOW_PARAM_MAX, "the kernels' 32-bit int range")
    if op == "lp":
        acc = ACC_DTYPES[g.dtype]
        p = check_real(func, "p", p, *(FLOAT32_RANGE if acc == "float32" else FLOAT64_RANGE),
                       f"a positive normal {acc}: the kernels take p and 1/p as {acc} for "
                       f"{g.dtype} input")
    out = tuple(output_length(*a, ceil_mode) for a in zip(g.spatial, kernel, stride, pads, dilation))
    if any(o < 1 for o in out):
        fail(func, f"computed output size {out} is too small (input {g.spatial}, kernel_size "
                    f"{kernel}, stride {stride}, padding {pads}, dilation {dilation})")
    check_output_size(func, g, out, f"padding={padding!r} with kernel_size={kernel}, "
                                    f"stride={stride}, dilation={dilation} on x of shape "
                                    f"{g.shape}", return_indices)
    return WindowSpec(g, op, kernel, stride, dilation, pads, ceil_mode, out, return_indices,
                      count_include_pad, divisor_override, p)


@dataclass(frozen=True)
class AdaptiveSpec:
    """Adaptive (and global) pooling: window i spans [floor(i*I/O), ceil((i+1)*I/O)).
    ``global_op``: built by a global op, whose average sums in a tree (adaptive: in order)."""

    __hash__ = hash_once
    __getstate__ = state_without_hash

    geom: Geometry
    op: str  # "max" | "avg"
    out_spatial: tuple[int, ...]
    return_indices: bool = False
    global_op: bool = False

    @functools.cached_property
    def out_shape(self) -> tuple[int, ...]:
        return self.geom.with_spatial(self.out_spatial)

    @functools.cached_property
    def whole_plane(self) -> bool:
        """Whether each output's window is its whole plane (output size 1)."""
        return all(o == 1 for o in self.out_spatial)

    @functools.cached_property
    def is_global(self) -> bool:
        """A reduction of whole planes: a global op, or a max to size 1 (exact in any order)."""
        return self.whole_plane and (self.global_op or self.op == "max")

    @functools.cached_property
    def uniform_window(self) -> WindowSpec | None:
        """The same pooling as a :class:`WindowSpec` when every input size is a multiple of
        its output size (window i is then ``[i*k, (i+1)*k)`` with ``k = I/O``: kernel = stride
        = k, no padding), else None."""
        if any(size % out for size, out in zip(self.geom.spatial, self.out_spatial)):
            return None
        kernel = tuple(size // out for size, out in zip(self.geom.spatial, self.out_spatial))
        nd = len(kernel)
        return WindowSpec(self.geom, self.op, kernel, kernel, (1,) * nd, ((0, 0),) * nd, False,
                          self.out_spatial, self.return_indices)


def adaptive_window(i: int, size: int, out: int) -> tuple[int, int]:
    """[start, end) of adaptive window ``i`` along a dim of ``size`` pooled to ``out``."""
    return (i * size) // out, -((-(i + 1) * size) // out)


@memoized
def adaptive_spec(func: str, op: str, shape, dtype: str, output_size, layout, *,
                  return_indices=False, integers=None) -> AdaptiveSpec:
    """Validate an adaptive pooling (``integers`` as in :func:`window_spec`)."""
    nd = spatial_rank(func, output_size, "output_size")
    g = geometry(func, shape, dtype, layout, nd,
                 integers=(op == "max") if integers is None else integers)
    out = _int_tuple(func, "output_size", output_size, nd, 1)
    return_indices = check_bool(func, "return_indices", return_indices)
    check_output_size(func, g, out, f"output_size={output_size!r} on x of shape {g.shape}",
                      return_indices)
    return AdaptiveSpec(g, op, out, return_indices)


@memoized
def global_spec(func: str, op: str, shape, dtype: str, spatial_dims, layout, *,
                integers=None) -> AdaptiveSpec:
    """Validate a global pooling (``integers`` as in :func:`window_spec`)."""
    if not is_int(spatial_dims):
        fail(func, f"spatial_dims={spatial_dims!r} must be an int", TypeError)
    if int(spatial_dims) < 1:
        fail(func, f"spatial_dims={spatial_dims!r} must be a positive int")
    nd = int(spatial_dims)
    g = geometry(func, shape, dtype, layout, nd,
                 integers=(op == "max") if integers is None else integers)
    return AdaptiveSpec(g, op, (1,) * nd, global_op=True)


@dataclass(frozen=True)
class UnpoolSpec:
    """Scatter of pooled values into zeros at per-plane flat indices: the pooling it undoes
    (kernel, stride, dilation, and its pads resolved on the unpooled size) and the indices'
    dtype."""

    __hash__ = hash_once
    __getstate__ = state_without_hash

    geom: Geometry  # geometry of the pooled input
    out_spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    index_dtype: str

    @functools.cached_property
    def out_shape(self) -> tuple[int, ...]:
        return self.geom.with_spatial(self.out_spatial)

    @functools.cached_property
    def plane_size(self) -> int:
        return math.prod(self.out_spatial)

    @functools.cached_property
    def pooling(self) -> WindowSpec:
        """The max pooling whose indices this unpools: input the unpooled shape, output the
        pooled one (its ceil_mode, not known here, changes neither)."""
        g = self.geom
        geom = Geometry(g.func, self.out_shape, g.dtype, g.layout, g.nd)
        return WindowSpec(geom, "max", self.kernel, self.stride, self.dilation, self.pads,
                          False, g.spatial, return_indices=True)

    @functools.cached_property
    def disjoint(self) -> bool:
        """Whether no two windows share a position: each window's extent d*(k-1)+1 is at
        most the stride, per dim."""
        return all(d * (k - 1) + 1 <= s for k, s, d in zip(self.kernel, self.stride,
                                                           self.dilation))


def unpool_sizes(spatial, kernel, stride, pads, dilation) -> tuple[tuple[int, int], ...]:
    """Per dim, the range ``[lo, hi]`` of sizes ``O`` that max_unpool accepts as output_size
    for a pooled size ``I``; ``pads`` is None for ``"same"``/``"same_lower"`` padding.

    SAME padding: the sizes that it pools to ``I``, ``ceil(O / s) == I``. Explicit
    ``(begin, end)`` pads: PyTorch's range, ``default - s < O < default + s`` with ``default =
    (I - 1) * s - pb - pe + d * (k - 1) + 1``, which holds every size that max_pool with these
    parameters pools to ``I`` (``ceil_mode`` False or True) while the pads are at most half
    the window; with gpupool's larger pads ``default + s`` is such a size too when the end pad
    covers a whole window (ceil mode drops the window that starts there), so it is included."""
    if pads is None:
        return tuple(((i - 1) * s + 1, i * s) for i, s in zip(spatial, stride))
    sizes = []
    for i, k, s, (b, e), d in zip(spatial, kernel, stride, pads, dilation):
        span = d * (k - 1) + 1
        default = (i - 1) * s - b - e + span
        sizes.append((max(default - s + 1, 1), default + s - 1 + (e >= span)))
    return tuple(sizes)


def unpool_default(spatial, kernel, stride, pads, dilation) -> tuple[int, ...]:
    """Unpooled size of each dim: ``(I - 1) * s - pb - pe + d * (k - 1) + 1`` (the smallest
    input that ``max_pool`` with these parameters pools to ``I``)."""
    return tuple((i - 1) * s - b - e + d * (k - 1) + 1
                 for i, s, (b, e), k, d in zip(spatial, stride, pads, kernel, dilation))


@memoized
def unpool_spec(func: str, shape, dtype: str, indices_shape, indices_dtype: str, kernel_size,
                stride, padding, output_size, layout, dilation=1) -> UnpoolSpec:
    """Validate a max_unpool. Each dim of ``output_size`` (spatial dims or the full shape)
    must lie in :func:`unpool_sizes` (PyTorch's ``default - stride < O < default + stride``,
    ``default`` being the size used when ``output_size`` is None): any other size would
    scatter the per-plane flat indices to the wrong positions."""
    nd = spatial_rank(func, kernel_size)
    g = geometry(func, shape, dtype, layout, nd, integers=True)
    if tuple(indices_shape) != g.shape:
        fail(func, f"indices shape {tuple(indices_shape)} != input shape {g.shape}")
    if indices_dtype not in INT_DTYPES:
        fail(func, f"indices dtype {indices_dtype} is not supported: use int64 (as max_pool "
                    f"returns)", TypeError)
    kernel, stride, dilation, given = window_arguments(func, kernel_size, stride, padding, dilation)
    mode = given if isinstance(given, str) else None
    if output_size is None:
        if mode in ("same", "same_lower"):
            fail(func, f"padding={padding!r} depends on the unknown unpooled size; pass "
                        f"output_size instead")
        pads = resolve_padding(func, padding, nd, g.spatial, kernel, stride, dilation)
        out = unpool_default(g.spatial, kernel, stride, pads, dilation)
        if any(o < 1 for o in out):
            fail(func, f"computed output size {out} is too small (input {g.spatial}, "
                        f"kernel_size {kernel}, stride {stride}, padding {pads}, dilation "
                        f"{dilation})")
        cause = (f"kernel_size={kernel}, stride={stride}, padding={pads}, dilation={dilation} "
                 f"on x of shape {g.shape}")
    else:
        if not isinstance(output_size, (tuple, list)):
            fail(func, f"output_size={output_size!r} must be a tuple", TypeError)
        sizes = tuple(output_size)
        if len(sizes) == len(g.shape):
            full = g.with_spatial(tuple(sizes[len(g.lead):len(g.lead) + nd]))
            if tuple(sizes) != full:
                fail(func, f"output_size={output_size!r} disagrees with the input's "
                            f"non-spatial dims {g.shape}")
            sizes = sizes[len(g.lead):len(g.lead) + nd]
        out = _int_tuple(func, "output_size", sizes, nd, 1)
        if mode in ("same", "same_lower"):
            allowed = unpool_sizes(g.spatial, kernel, stride, None, dilation)
            why = "the sizes O that SAME padding pools to x's: ceil(O / stride) == I"
        else:
            pads = resolve_padding(func, padding, nd, g.spatial, kernel, stride, dilation)
            allowed = unpool_sizes(g.spatial, kernel, stride, pads, dilation)
            why = (f"PyTorch's rule: strictly between default - stride and default + stride, "
                   f"default {unpool_default(g.spatial, kernel, stride, pads, dilation)} = "
                   f"(I - 1) * stride - pads + dilation * (kernel_size - 1) + 1, the sizes "
                   f"that max_pool pools to I")
        if any(not lo <= o <= hi for o, (lo, hi) in zip(out, allowed)):
            fail(func, f"output_size={output_size!r} does not fit x of spatial size "
                        f"I = {g.spatial}: with kernel_size {kernel}, stride {stride}, padding "
                        f"{padding!r} and dilation {dilation} each dim must lie in "
                        f"{' x '.join(f'[{lo}, {hi}]' for lo, hi in allowed)} ({why}); indices "
                        f"pooled from another size would land at wrong positions")
        cause = f"output_size={output_size!r} on x of shape {g.shape}"
    check_output_size(func, g, out, cause)
    pads = resolve_padding(func, padding, nd, out, kernel, stride, dilation)
    return UnpoolSpec(g, out, kernel, stride, dilation, pads, indices_dtype)


def check_unpool_indices(func: str, low: int, high: int, spec: UnpoolSpec) -> None:
    """max_unpool's indices, given their smallest and largest value, must lie in the output
    plane, or be -1: max_pool's index of a window with no valid tap, which is skipped (its
    value is not written)."""
    if low < -1 or high >= spec.plane_size:
        fail(func, f"indices span [{low}, {high}], outside the output plane "
                    f"[0, {spec.plane_size}) of spatial size {spec.out_spatial} (an index -1, "
                    f"from a window with no valid tap, is skipped)")


def check_out(func: str, out_shape, out_dtype, out_native: bool, expected_shape,
              expected_dtype) -> None:
    """``out=`` must match the result's shape and dtype exactly, in native byte order (the
    kernels write it in place)."""
    if tuple(out_shape) != tuple(expected_shape) or out_dtype != expected_dtype:
        fail(func, f"out has shape {tuple(out_shape)} and dtype {out_dtype}; expected shape "
                    f"{tuple(expected_shape)} and dtype {expected_dtype}")
    if not out_native:
        fail(func, f"out has dtype {out_dtype} in non-native (byte-swapped) byte order; the "
                    f"result is written into out in place in native order: pass an array of "
                    f"native byte order")
