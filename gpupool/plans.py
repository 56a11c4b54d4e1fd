"""The plan cache of the public ops: what a call builds from its arguments alone (the spec,
the backend's prepared implementation, a quantized op's requantization plan) is kept per
key, so a warm call costs one dictionary lookup.

A key is the op, the backend, the input's shape, strides and dtype, the arguments with the
type of each at any depth (``2``, ``2.0`` and ``True`` are other keys) and the CPU thread
count; a call with another kind of argument (a NumPy scalar, an array) is not cached and
validates as usual. Bounded (least recently used first out) and safe across threads: a hit
takes no lock."""
from __future__ import annotations

import collections
import threading
from typing import Callable

from .cpu import threads

CACHE_SIZE = 1024  # keys kept
_plans: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()
_PLAIN = frozenset((int, float, bool, str, type(None)))


def _sequence_positions(types: tuple) -> tuple[int, ...] | None:
    """Where ``types`` has a tuple or list; None when one is neither that nor plain."""
    positions = _SEQUENCES.get(types)
    if positions is None:
        if not all(t in _PLAIN or t is tuple or t is list for t in types):
            return None
        positions = _SEQUENCES[types] = tuple(
            i for i, t in enumerate(types) if t is tuple or t is list)
    return positions


_SEQUENCES: dict = {}  # a tuple of argument types -> where its sequences are


def arguments_key(values: tuple) -> tuple | None:
    """``values`` with the type of each at any depth, or None when one is not a plain int,
    float, bool, str, None or a tuple or list of them."""
    types = tuple(map(type, values))
    if _PLAIN.issuperset(types):  # no sequences: the values and their types
        return tuple(values), types
    positions = _sequence_positions(types)
    if positions is None:
        return None
    key = list(values)
    for i in positions:  # a sequence: its own key in its place
        key[i] = arguments_key(values[i])
        if key[i] is None:
            return None
    return tuple(key), types


def cached(op: str, backend: str, x, arguments: tuple, build: Callable):
    """``build()`` (which validates the arguments, raising as the uncached op would) on the
    first call of a key, the kept result on later ones."""
    arguments = arguments_key(arguments)
    if arguments is None:
        return build()
    key = (op, backend, x.shape, x.strides, x.dtype, threads.get_num_threads(), arguments)
    plan = _plans.get(key)  # one C call each, atomic: hits take no lock
    if plan is not None:
        try:
            _plans.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile
            pass
        return plan
    plan = build()
    with _lock:
        _plans[key] = plan
        if len(_plans) > CACHE_SIZE:
            _plans.popitem(last=False)
    return plan


def clear() -> None:
    """Forget every plan."""
    with _lock:
        _plans.clear()
