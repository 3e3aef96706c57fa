"""The context-manager half every store shares: ``with Store.open(...) as s:`` closes ``s`` on the way out."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Closing"]


class Closing:
    """Mixin for classes with a ``close()``: ``__enter__`` returns the store, ``__exit__`` closes it."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()  # type: ignore[attr-defined]
