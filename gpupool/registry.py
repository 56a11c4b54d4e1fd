"""The registry of implementations, ``(family, backend) -> function``: a backend module
registers its functions when imported (:func:`register`); :func:`gpupool.backends.implementation`
imports the backend's modules and looks them up (:func:`registered`)."""
from __future__ import annotations

from typing import Callable

_REGISTRY: dict[tuple[str, str], Callable] = {}


def register(family: str, backend: str) -> Callable:
    """Decorator: make ``func`` the implementation of ``family`` on ``backend``."""
    def wrap(func: Callable) -> Callable:
        _REGISTRY[(family, backend)] = func
        return func
    return wrap


def registered(family: str, backend: str) -> Callable | None:
    """The function registered for ``family`` on ``backend``, or None."""
    return _REGISTRY.get((family, backend))
