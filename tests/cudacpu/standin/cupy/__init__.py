"""A stand-in for the part of CuPy that gpupool uses, running kernels on the CPU executor.

Put ``tests/cudacpu/standin`` first on ``sys.path`` (``tests/conftest.py`` does, on a machine
without a usable GPU) and the CUDA backend (``gpupool.cuda``) runs unchanged:

* ``ndarray`` is a NumPy subclass that also records its device and the stream that last wrote
  it; ``asarray``, ``empty``, ... and any other NumPy function reached through this module
  return it. Its memory is as strict as a GPU's: every fresh array starts at a 512-byte
  boundary, as CuPy's pool hands out blocks (the executor keeps each kernel argument's address
  modulo 512, so a misaligned view stays misaligned); ``empty`` / ``empty_like`` memory holds
  POISON bytes (a GPU returns stale pool bytes: an output a kernel never writes shows as NaN
  or -1). NumPy operands in its arithmetic are refused with ``TypeError``, as CuPy does, and
  so is ``numpy.asarray`` (``array``, ``asanyarray``, ...) of a device array: CuPy allows no
  implicit conversion (``get`` / ``asnumpy`` copy to the host).
* CuPy's own kernels (arithmetic, reductions, ``astype``) are compiled with ``-ftz=true``: here
  float32 subnormal operands and results of ufuncs, reductions and conversions are flushed to
  signed zeros too (copies, ``where`` and reshapes keep them, as moves do on a GPU).
* ``cuda.Device``, ``cuda.runtime``: ``CUDACPU_DEVICES`` devices (default 2) with an H100's
  properties, so the planner makes the launches it makes on an H100 (``CUDACPU_SM_COUNT``, read
  at each query, replaces its 132 SMs).
* ``cuda.Stream`` (and ``cuda.ExternalStream``, another library's stream by its pointer):
  streams with CUDA's ordering rules (the legacy null stream is ordered with
  blocking streams; two other streams are not). A kernel, ``get`` or copy touching an array
  last written on a stream it is not ordered with, and not synchronised since, is refused:
  on a GPU it would race. A stream belongs to the device current at its creation, and each
  device has its own current stream (``with stream:`` sets its device's); a launch on a stream
  of another device is refused.
* ``cuda.set_allocator`` / ``get_default_memory_pool``: the pool counts the bytes of live
  arrays it allocated (``used_bytes``); ``set_allocator(None)`` allocates outside it.
* ``cuda.compiler.compile_using_nvrtc`` compiles with the host compiler (tests/cudacpu/
  executor.py) and records its options; ``-ftz=true`` is honoured by flushing subnormals
  (x86 MXCSR FTZ/DAZ) during the launch, as NVRTC's flag does on a GPU.
* ``cuda.function.Module`` / ``Function``: a launch refuses arrays of another device or type.
* ``cuda.profiler.start`` / ``stop``: each range keeps the kernels launched and the compiles
  made inside it (``profiler.ranges``).
* ``cupyx`` (``standin/cupyx``) has only ``cupyx.profiler.benchmark``, timed on the host.

Not a general CuPy: only what gpupool and its tests touch.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import threading
import types
import weakref
from pathlib import Path

import numpy as _np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # tests/
from cudacpu import executor as _executor  # noqa: E402

__version__ = "0.0.0+cudacpu"
DEVICE_COUNT = int(os.environ.get("CUDACPU_DEVICES", "2"))
_state = threading.local()


class CUDARuntimeError(RuntimeError):
    pass


# ----------------------------------------------------------------------------- streams
class Stream:
    """A CUDA stream of the current device (the null stream: of every device): work on it is
    ordered; ``synchronize`` waits for all of it."""

    _count = 0

    def __init__(self, non_blocking: bool = False, null: bool = False):
        Stream._count += 1
        self.ptr = 0 if null else Stream._count
        self.non_blocking = non_blocking
        self.is_null = null
        self.device_id = -1 if null else _current_device()
        self._entered: list[int] = []  # the device whose current stream each `with` set
        self.epoch = 0  # work items enqueued so far
        self.done = 0  # work items known finished (synchronize)

    def __repr__(self) -> str:
        return "<Stream null>" if self.is_null else f"<Stream {self.ptr}>"

    def enqueue(self) -> int:
        self.epoch += 1
        return self.epoch

    def synchronize(self) -> None:
        self.done = self.epoch

    def ordered_with(self, other: "Stream") -> bool:
        if self is other:
            return True
        legacy = (self.is_null or other.is_null)
        return legacy and not self.non_blocking and not other.non_blocking

    def __enter__(self):
        device = _current_device() if self.is_null else self.device_id
        self._entered.append(device)
        _streams(device).append(self)
        return self

    def __exit__(self, *exc):
        _streams(self._entered.pop()).pop()
        return False


class ExternalStream(Stream):
    """A stream another library made (``ptr``, its ``cudaStream_t``), as CuPy's: 0 is the
    legacy null stream; another one is taken as non-blocking (PyTorch makes its own so), of
    ``device_id`` (default: the current device)."""

    def __init__(self, ptr: int, device_id: int = -1):
        super().__init__(non_blocking=ptr != 0, null=ptr == 0)
        self.ptr = ptr
        if ptr != 0 and device_id >= 0:
            self.device_id = device_id


def _stack(name: str) -> list:
    try:
        return getattr(_state, name)
    except AttributeError:  # a thread's first use
        setattr(_state, name, [])
        return getattr(_state, name)


def _streams(device: int) -> list:
    """The stack of current streams of ``device`` (this thread's)."""
    try:
        return _state.streams.setdefault(device, [])
    except AttributeError:  # a thread's first use
        _state.streams = {}
        return _state.streams.setdefault(device, [])


def get_current_stream(device_id: int = -1) -> Stream:
    """The current stream of ``device_id`` (default: of the current device)."""
    streams = _streams(_current_device() if device_id == -1 else device_id)
    return streams[-1] if streams else Stream.null


# ----------------------------------------------------------------------------- devices
class Device:
    """``with Device(i):`` makes device ``i`` current; ``Device()`` is the current one."""

    def __init__(self, device=None):
        self.id = _current_device() if device is None else int(device)
        if not 0 <= self.id < DEVICE_COUNT:
            raise CUDARuntimeError(f"cudaErrorInvalidDevice: device {self.id} of {DEVICE_COUNT}")

    def __enter__(self):
        _stack("devices").append(self.id)
        return self

    def __exit__(self, *exc):
        _stack("devices").pop()
        return False

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(("device", self.id))

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"

    @property
    def compute_capability(self) -> str:
        return "90"

    def synchronize(self) -> None:
        for s in _WRITERS_SEEN:  # a stream that never wrote has nothing to wait for
            s.synchronize()


def _current_device() -> int:
    devices = _stack("devices")
    return devices[-1] if devices else 0


_WRITERS_SEEN: "set[Stream]" = set()
Stream.null = Stream(null=True)


class _Runtime:
    @staticmethod
    def getDevice() -> int:
        return _current_device()

    @staticmethod
    def getDeviceCount() -> int:
        return DEVICE_COUNT

    @staticmethod
    def runtimeGetVersion() -> int:
        return 13000

    @staticmethod
    def driverGetVersion() -> int:
        return 13000

    @staticmethod
    def getDeviceProperties(device: int) -> dict:
        return {"name": b"cudacpu executor (H100 properties)", "major": 9, "minor": 0,
                "multiProcessorCount": int(os.environ.get("CUDACPU_SM_COUNT", "132")),
                "maxThreadsPerBlock": 1024,
                "maxThreadsPerMultiProcessor": 2048, "sharedMemPerBlockOptin": 227 * 1024,
                "sharedMemPerBlock": 48 * 1024, "sharedMemPerMultiprocessor": 228 * 1024,
                "l2CacheSize": 50 * 2**20, "totalGlobalMem": 80 * 2**30,
                "memoryClockRate": 2619000, "memoryBusWidth": 5120}


# ----------------------------------------------------------------------------- arrays
class _Pointer:
    def __init__(self, ptr: int, device_id: int):
        self.ptr, self.device_id = ptr, device_id


def _root(a: _np.ndarray) -> _np.ndarray:
    while isinstance(a.base, _np.ndarray):
        a = a.base
    return a


#: The byte of fresh ``empty`` memory: NaN in every float dtype, -1 in every signed integer.
POISON = 0xFF
#: Fresh arrays start at a multiple of ALIGN bytes, as the blocks of CuPy's pool.
ALIGN = 512
_TINY32 = _np.float32(2.0**-126)


class MemoryPool:
    """CuPy's default pool, as far as gpupool uses it: ``malloc`` counts the bytes of the live
    arrays it allocated, in blocks of ALIGN bytes."""

    def __init__(self):
        self._used = 0

    def malloc(self, nbytes: int) -> _np.ndarray:
        size = -(-max(nbytes, 1) // ALIGN) * ALIGN
        block = _malloc(nbytes)
        self._used += size
        weakref.finalize(_root(block), self._release, size)  # arrays keep the root alive
        return block

    def _release(self, size: int) -> None:
        self._used -= size

    def used_bytes(self) -> int:
        return self._used

    def free_all_blocks(self) -> None:
        pass


def _malloc(nbytes: int) -> _np.ndarray:
    """``nbytes`` fresh POISON bytes starting at a multiple of ALIGN (``cudaMalloc``)."""
    raw = _np.empty(nbytes + ALIGN, _np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    block = raw[start:start + nbytes]
    block.fill(POISON)
    return block


_POOL = MemoryPool()
_allocator = _POOL.malloc


def get_default_memory_pool() -> MemoryPool:
    return _POOL


def set_allocator(allocator=None) -> None:
    """Allocate through ``allocator`` (``nbytes -> memory``); None: directly, outside the pool."""
    global _allocator
    _allocator = _malloc if allocator is None else allocator


def get_allocator():
    return _allocator


def _fresh(shape, dtype, strides=None, order="C") -> "ndarray":
    """A device array of the current device on fresh memory from the current allocator."""
    dtype = _np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, _np.integer)) else tuple(shape)
    nbytes = int(_np.prod(shape, dtype=_np.int64)) * dtype.itemsize
    return _np.ndarray(shape, dtype, buffer=_allocator(nbytes), strides=strides,
                       order=order).view(ndarray)


def _flushed(a):
    """``a`` with its float32 subnormals as zeros of their sign (``-ftz=true``); other dtypes
    and values unchanged. A copy where anything is flushed."""
    if isinstance(a, (_np.ndarray, _np.generic)) and a.dtype == _np.float32:
        host = a.view(_np.ndarray) if isinstance(a, ndarray) else a
        tiny = (host != 0) & (abs(host) < _TINY32)
        if tiny.any():
            return _np.where(tiny, _np.copysign(_np.float32(0), host), host).astype(_np.float32)
    return a


def _refuse_host_arrays(args, what: str) -> None:
    for v in args:
        if isinstance(v, _np.ndarray) and not isinstance(v, ndarray):
            raise TypeError(f"cudacpu: {what}: a NumPy array operand (CuPy refuses "
                            f"implicit host-to-device conversion; use cupy.asarray)")


class ndarray(_np.ndarray):
    """A NumPy array that lives on a device and remembers the stream that last wrote it."""

    def __array_finalize__(self, obj):
        device = getattr(obj, "_device", None)
        self._device = _current_device() if device is None else device

    @property
    def device(self) -> Device:
        return Device(self._device)

    @property
    def data(self) -> _Pointer:
        # read once per array, as CuPy keeps its pointer (NumPy builds a dict to tell it)
        pointer = self.__dict__.get("_pointer")
        if pointer is None:
            pointer = self._pointer = _Pointer(self.__array_interface__["data"][0],
                                               self._device)
        return pointer

    @property
    def __cuda_array_interface__(self) -> dict:
        return self.__array_interface__

    def _host(self) -> _np.ndarray:
        return self.view(_np.ndarray)

    def get(self, stream=None) -> _np.ndarray:
        _touch(self, stream or get_current_stream(), "get()")
        (stream or get_current_stream()).synchronize()
        return _np.array(self._host(), copy=True)

    def set(self, arr, stream=None) -> None:
        _touch(self, stream or get_current_stream(), "set()", write=True)
        self._host()[...] = arr

    def fill(self, value) -> None:
        _touch(self, get_current_stream(), "fill()", write=True)
        self._host().fill(value)

    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        """A conversion in a CuPy kernel (float32 subnormals flushed); the same dtype without
        ``copy`` is ``self``."""
        dtype = _np.dtype(dtype)
        if dtype == self.dtype and not copy:
            return self
        _check_inputs((self,), {}, "astype")
        if dtype == self.dtype:
            return _adopt(self._host().copy(order))
        return _adopt(_flushed(_flushed(self._host()).astype(dtype, order, casting)))

    def copy(self, order="C"):
        _check_inputs((self,), {}, "copy")
        return _adopt(self._host().copy(order))

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        """A ufunc of device arrays as a CuPy kernel: same device, no NumPy operands, float32
        subnormals flushed in and out."""
        what = f"{ufunc.__name__}.{method}"
        _refuse_host_arrays(inputs + (out or ()), what)
        _check_inputs(inputs, {}, what)
        args = [_flushed(a._host()) if isinstance(a, ndarray) else _flushed(a) for a in inputs]
        if out is None:
            return _adopt(_flushed(getattr(ufunc, method)(*args, **kwargs)))
        _check_inputs(out, {}, what)
        hosts = tuple(o._host() for o in out)
        for o in out:
            _touch(o, get_current_stream(), what, write=True)
        getattr(ufunc, method)(*args, out=hosts, **kwargs)
        for h in hosts:
            h[...] = _flushed(h)
        return out[0] if len(out) == 1 else out

    def __setitem__(self, key, value) -> None:
        _touch(self, get_current_stream(), "__setitem__", write=True)
        self._host()[key] = value._host() if isinstance(value, ndarray) else value


def _touch(a: ndarray, stream: Stream, what: str, write: bool = False) -> None:
    """Refuse an access on ``stream`` that may race with the array's last writer; record
    ``stream`` as the writer when ``write``."""
    root = _root(a)
    writer = _WRITERS.get(id(root))
    if writer is not None:
        w_stream, w_epoch = writer
        if not w_stream.ordered_with(stream) and w_stream.done < w_epoch:
            raise _executor.LaunchError(
                f"cudacpu: {what} on {stream} touches an array last written on {w_stream}, "
                f"which is not ordered with it and was not synchronised since (a race on a GPU)")
    if write:
        if id(root) not in _WRITERS:
            weakref.finalize(root, _WRITERS.pop, id(root), None)
        _WRITERS[id(root)] = (stream, stream.enqueue())
        _WRITERS_SEEN.add(stream)


#: id of a memory owner -> (stream, epoch) of its last write
_WRITERS: dict[int, tuple[Stream, int]] = {}


def _adopt(result):
    """NumPy results as device arrays of the current device, written on the current stream
    (a result with memory of its own is moved to fresh device memory, a view stays a view;
    a scalar becomes a 0-d array, as CuPy's reductions return)."""
    if isinstance(result, _np.generic):
        result = _np.asarray(result)
    if isinstance(result, _np.ndarray) and not isinstance(result, ndarray):
        if result.flags.owndata:
            fresh = _fresh(result.shape, result.dtype, result.strides)
            fresh._host()[...] = result
            result = fresh
        else:
            result = result.view(ndarray)
        result._device = _current_device()
        _touch(result, get_current_stream(), "a copy", write=True)
    elif isinstance(result, tuple):
        result = tuple(_adopt(r) for r in result)
    return result


def _check_inputs(args, kwargs, what: str) -> None:
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, ndarray):
            if v._device != _current_device():
                raise _executor.LaunchError(f"cudacpu: {what} on device {_current_device()} "
                                            f"reads an array of device {v._device}")
            _touch(v, get_current_stream(), what)


#: NumPy functions that run arithmetic in CuPy's kernels (ufuncs besides): their float32
#: operands and results are flushed, as ``-ftz=true`` does.
_ARITHMETIC = {"clip", "sum", "prod", "mean", "average", "cumsum", "cumprod", "amax", "amin",
               "max", "min", "around", "round", "dot", "matmul", "var", "std", "nansum",
               "nanmean", "nanmax", "nanmin", "linspace", "interp"}


def _device_function(func):
    flush = isinstance(func, _np.ufunc) or func.__name__ in _ARITHMETIC

    @functools.wraps(func)
    def run(*args, **kwargs):
        _check_inputs(args, kwargs, func.__name__)
        plain = [a._host() if isinstance(a, ndarray) else a for a in args]
        if flush:
            _refuse_host_arrays(args, func.__name__)
            return _adopt(_flushed(func(*[_flushed(a) for a in plain], **kwargs)))
        return _adopt(func(*plain, **kwargs))
    return run


def asarray(a, dtype=None, order=None):
    if isinstance(a, ndarray) and a._device == _current_device() and dtype in (None, a.dtype) \
            and order is None:
        return a
    if isinstance(a, ndarray):
        _check_inputs((a,), {}, "asarray")
        a = a._host()
    return _adopt(_np.array(a, dtype=dtype, order=order or "K", copy=True))


def array(a, dtype=None, copy=True, order="K"):
    if isinstance(a, ndarray):
        _check_inputs((a,), {}, "array")
        a = a._host()
    return _adopt(_np.array(a, dtype=dtype, order=order, copy=True))


def empty(shape, dtype=float, order="C"):
    """Fresh memory of the current device, full of POISON bytes (not zeros)."""
    return _fresh(shape, dtype, order=order)


def empty_like(a, dtype=None, order="K", shape=None):
    """:func:`empty` with ``a``'s shape and dtype (C order unless ``a`` is Fortran-ordered)."""
    fortran = order == "F" or (order in ("A", "K") and a.flags.f_contiguous
                               and not a.flags.c_contiguous)
    return _fresh(a.shape if shape is None else shape, a.dtype if dtype is None else dtype,
                  order="F" if fortran else "C")


def asnumpy(a, stream=None):
    if isinstance(a, ndarray):
        return a.get(stream)
    return _np.asarray(a)


def may_share_memory(a, b, max_work=None) -> bool:
    return _np.may_share_memory(a.view(_np.ndarray), b.view(_np.ndarray))


_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
             "construct a NumPy array explicitly.")


def _refusing_device_arrays(convert):
    """NumPy's ``convert`` (``numpy.asarray``, ...) refusing a device array, as CuPy's
    ``__array__`` does."""
    @functools.wraps(convert)
    def strict(a, *args, **kwargs):
        if isinstance(a, ndarray):
            raise TypeError(_IMPLICIT)
        return convert(a, *args, **kwargs)
    return strict


# An ndarray subclass has no hook NumPy's conversions call, so the functions themselves refuse
# (called through the numpy module; NumPy's C internals still see a plain array).
for _name in ("asarray", "array", "asanyarray", "ascontiguousarray", "asfortranarray"):
    setattr(_np, _name, _refusing_device_arrays(getattr(_np, _name)))


def __getattr__(name):
    value = getattr(_np, name)
    if callable(value) and not isinstance(value, type):
        return _device_function(value)
    return value


def memoize(for_each_device: bool = False):
    """Cache results by arguments (and by the current device when ``for_each_device``)."""
    def decorate(func):
        cache = {}

        @functools.wraps(func)
        def run(*args, **kwargs):
            key = (_current_device() if for_each_device else None, args,
                   tuple(sorted(kwargs.items())))
            if key not in cache:
                cache[key] = func(*args, **kwargs)
            return cache[key]
        run.cache_clear = cache.clear
        return run
    return decorate


# ----------------------------------------------------------------------------- compiler
class CompileException(RuntimeError):
    pass


#: source text -> every name expression the project can ask of it; a request for some of
#: them builds them in chunks of CHUNK names (one host compile serves many kernels).
batches: dict[str, tuple[str, ...]] = {}
CHUNK = 48
#: (options, name_expressions) of every compile_using_nvrtc call.
calls: list[tuple[tuple[str, ...], tuple[str, ...]]] = []


def chunks(code: str, names) -> list[tuple[str, tuple[str, ...]]]:
    """The (code, names) library jobs that hold ``names`` of ``code``."""
    batch = batches.get(code, ())
    if not set(names) <= set(batch):
        return [(code, tuple(names))]
    every = sorted(batch)
    groups = [tuple(every[i:i + CHUNK]) for i in range(0, len(every), CHUNK)]
    return [(code, g) for g in groups if set(g) & set(names)]


def compile_using_nvrtc(source, options=(), arch=None, filename="kern.cu",
                        name_expressions=None, log_stream=None, cache_in_memory=False,
                        jitify=None, method=None):
    names = tuple(name_expressions or ())
    options = tuple(options)
    calls.append((options, names))
    _profiler.note("compiles", names)
    ftz = any(o.replace("--", "-") == "-ftz=true" for o in options)
    build = _executor.Build.from_env()
    try:
        jobs = chunks(source, names)
        paths = _executor.build_libraries(jobs, build, ("CUDACPU_FTZ",) if ftz else ())
    except _executor.CompileError as exc:
        raise CompileException(str(exc)) from None
    image = json.dumps([[str(p), list(ns)] for p, (_, ns) in zip(paths, jobs)]).encode()
    return image, {n: n for n in names}


class Function:
    """A loaded kernel: ``f(grid, block, args, shared_mem=0, stream=None)``."""

    def __init__(self, kernel: _executor.Kernel):
        self.kernel = kernel

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        if shared_mem:
            raise _executor.LaunchError("cudacpu: dynamic shared memory is not modelled")
        stream = stream or get_current_stream()
        name = self.kernel.name
        if stream.device_id not in (-1, _current_device()):
            raise _executor.LaunchError(
                f"{name}: launched on device {_current_device()} on a stream of device "
                f"{stream.device_id} (an invalid resource handle on a GPU)")
        for i, a in enumerate(args):
            if isinstance(a, _np.ndarray) and not isinstance(a, ndarray):
                raise TypeError(f"{name}: argument {i} is a host (NumPy) array")
        self.kernel.check_args(args)
        device = _current_device()
        for i, (a, p) in enumerate(zip(args, self.kernel.params)):
            if p.kind == "p":
                if a._device != device:
                    raise _executor.LaunchError(
                        f"{name}: argument {i} lives on device {a._device}, the launch runs "
                        f"on device {device} (an illegal address on a GPU)")
                _touch(a, stream, f"{name} argument {i}", write=not p.const)
        self.kernel(grid, block, [a._host() if isinstance(a, ndarray) else a for a in args])
        _profiler.note("launches", name)


class Module:
    """A loaded image of :func:`compile_using_nvrtc`."""

    def __init__(self):
        self.kernels = {}

    def load(self, image: bytes) -> None:
        for path, names in json.loads(image.decode()):
            library = _libraries(path, tuple(names))
            for n in names:
                self.kernels[n] = library

    def get_function(self, name: str) -> Function:
        return Function(self.kernels[name].kernel(name))


@functools.lru_cache(maxsize=None)
def _libraries(path: str, names: tuple[str, ...]) -> _executor.Library:
    return _executor.Library(Path(path), names)


def _assemble_cupy_compiler_options(options):
    return ("-I/cudacpu/cupy/include",) + tuple(options)


# ----------------------------------------------------------------------------- profiler
class _Profiler:
    """Profiler ranges: ``ranges`` holds one {"launches": [...], "compiles": [...]} per
    start/stop pair."""

    def __init__(self):
        self.ranges = []
        self.active = False

    def start(self) -> None:
        self.ranges.append({"launches": [], "compiles": []})
        self.active = True

    def stop(self) -> None:
        self.active = False

    def note(self, what: str, item) -> None:
        """Keep ``item`` under ``what`` ("launches", "compiles") when inside a range."""
        if self.active:
            self.ranges[-1][what].append(item)


_profiler = _Profiler()


def _nvrtc_version():
    return (13, 0)


cuda = types.ModuleType("cupy.cuda")
cuda.runtime = types.ModuleType("cupy.cuda.runtime")
for _name in ("getDevice", "getDeviceCount", "runtimeGetVersion", "driverGetVersion",
              "getDeviceProperties"):
    setattr(cuda.runtime, _name, getattr(_Runtime, _name))
cuda.runtime.CUDARuntimeError = CUDARuntimeError
cuda.compiler = types.ModuleType("cupy.cuda.compiler")
cuda.compiler.compile_using_nvrtc = compile_using_nvrtc
cuda.compiler.CompileException = CompileException
cuda.function = types.ModuleType("cupy.cuda.function")
cuda.function.Module = Module
cuda.function.Function = Function
cuda.nvrtc = types.ModuleType("cupy.cuda.nvrtc")
cuda.nvrtc.getVersion = _nvrtc_version
cuda.profiler = types.ModuleType("cupy.cuda.profiler")
cuda.profiler.start = _profiler.start
cuda.profiler.stop = _profiler.stop
cuda.profiler.ranges = _profiler.ranges
cuda.Device = Device
cuda.Stream = Stream
cuda.ExternalStream = ExternalStream
cuda.get_current_stream = get_current_stream
cuda.set_allocator = set_allocator
cuda.get_allocator = get_allocator
cuda.MemoryPool = MemoryPool
_core = types.ModuleType("cupy._core")
_core.core = types.ModuleType("cupy._core.core")
_core.core.assemble_cupy_compiler_options = _assemble_cupy_compiler_options
for _module in (cuda, cuda.runtime, cuda.compiler, cuda.function, cuda.nvrtc, cuda.profiler,
                _core, _core.core):
    sys.modules[_module.__name__] = _module
