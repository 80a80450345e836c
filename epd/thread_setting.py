"""A value set for the calling thread while a block runs (a forward's step-wide facts that the
modules' rerouted forwards read, but that the library's call chain gives no argument for)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class ThreadSetting(Generic[T]):
    def __init__(self, default: T) -> None:
        self.default = default
        self._local = threading.local()

    def get(self) -> T:
        """The calling thread's value: the innermost `set` it is in, else the default."""
        return getattr(self._local, "value", self.default)

    @contextmanager
    def set(self, value: T) -> Iterator[None]:
        previous = self.get()
        self._local.value = value
        try:
            yield
        finally:
            self._local.value = previous
