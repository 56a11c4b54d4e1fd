"""How specs are cached and hashed: a spec builder memoized on its typed arguments, and a
frozen spec's hash kept once computed."""
from __future__ import annotations

import functools
from dataclasses import fields


def _typed_key(value):
    """A cache key that tells ``2`` from ``2.0`` and ``True`` at any depth (leaves inline:
    this runs on every warm call)."""
    if isinstance(value, (tuple, list)):
        return type(value), tuple([_typed_key(v) if isinstance(v, (tuple, list)) else (type(v), v)
                                   for v in value])
    return type(value), value


def memoized(build):
    """Cache a spec builder on its arguments (keyed with their types, at any depth), so a
    warm call skips validation; unhashable arguments just bypass the cache."""
    cache: dict = {}

    @functools.wraps(build)
    def wrapper(*args, **kwargs):
        try:
            key = _typed_key(args), _typed_key(tuple(kwargs.items()))  # call sites keep one order
            hash(key)
        except TypeError:
            return build(*args, **kwargs)
        spec = cache.get(key)
        if spec is None:
            if len(cache) >= 1024:
                cache.clear()
            spec = cache[key] = build(*args, **kwargs)
        return spec
    return wrapper


def hash_once(self) -> int:
    """The hash of a frozen spec, computed on first use and kept: specs key every cache on the
    hot path, and hashing their nested tuples costs about a microsecond."""
    value = self.__dict__.get("_hash")
    if value is None:
        value = hash(tuple(getattr(self, f.name) for f in fields(self)))
        object.__setattr__(self, "_hash", value)
    return value


def state_without_hash(self) -> dict:
    """What pickles: the fields, not the kept hash (string hashes differ between processes)."""
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}
