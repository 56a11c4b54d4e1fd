"""Memos of the arrays derived from a spec or a shape (the NumPy backend's divisors, window
starts and position words; the quantized ops' per-position table rows, on the host and on each
device), bounded in bytes as well as in entries.

Such arrays grow with the planes (a word per input or output position), so a memo keeps an
entry only while all of its entries hold at most ``max_bytes`` of arrays, least recently used
out first; a value larger than that is returned and not kept. A large call thus leaves
nothing large behind: its arrays are built again by the next call that needs them, whose
own work is at least as large. Safe across threads: a hit takes no lock.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from typing import Callable

import numpy as np

from ..arrays import is_cupy_array

MEMO_BYTES = 1 << 22  # arrays kept per memo
_memos: list[ArrayMemo] = []


def held_bytes(value) -> int:
    """Bytes of the NumPy and CuPy arrays in ``value``: an array, or a tuple, list or dataclass
    of such values at any depth (anything else holds none)."""
    if isinstance(value, np.ndarray) or is_cupy_array(value):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(map(held_bytes, value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(held_bytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 0


class ArrayMemo:
    """``build(*args)`` memoized on its (hashable) arguments, keeping at most ``max_entries``
    entries holding at most ``max_bytes`` of arrays in all."""

    def __init__(self, build: Callable, max_entries: int, max_bytes: int = MEMO_BYTES):
        self._build, self.max_entries, self.max_bytes = build, max_entries, max_bytes
        self._entries: collections.OrderedDict = collections.OrderedDict()  # args -> (value, bytes)
        self._bytes = 0
        self._lock = threading.Lock()
        # a hit is two C calls on these (each atomic: hits take no lock), found once here
        self._find, self._renew = self._entries.get, self._entries.move_to_end
        functools.update_wrapper(self, build)

    def __call__(self, *args):
        entry = self._find(args)
        if entry is not None:
            try:
                self._renew(args)
            except KeyError:  # evicted by another thread meanwhile
                pass
            return entry[0]
        value = self._build(*args)
        size = held_bytes(value)
        if size <= self.max_bytes:
            with self._lock:
                if args not in self._entries:
                    self._entries[args] = (value, size)
                    self._bytes += size
                while self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
                    self._bytes -= self._entries.popitem(last=False)[1][1]
        return value

    def __len__(self) -> int:
        """Entries kept."""
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays kept."""
        return self._bytes

    def cache_clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def array_memo(max_entries: int, max_bytes: int = MEMO_BYTES) -> Callable[[Callable], ArrayMemo]:
    """Decorator: the function as an :class:`ArrayMemo`."""
    def wrap(build: Callable) -> ArrayMemo:
        memo = ArrayMemo(build, max_entries, max_bytes)
        _memos.append(memo)
        return memo
    return wrap


def memo_bytes() -> int:
    """Bytes of the arrays that every memo of this kind keeps."""
    return sum(memo.nbytes for memo in _memos)
