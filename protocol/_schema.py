"""Field kinds: one table drives encoding, decoding and validation of every message in both codecs.

Each message declares its fields as kinds (an unsigned integer, a bounded string, a list of records...). The
same kind checks a value on the way out (so we never send what a peer would reject) and on the way in (so a
peer cannot make us build anything unbounded or ill-typed). A failure raises `Invalid` with the path to the bad
field; the codec layer turns it into a Local- or RemoteProtocolError, whichever side is at fault.
"""

from __future__ import annotations

import binascii
import dataclasses
import ipaddress
import math
import re
from abc import ABC, abstractmethod
from base64 import b64decode, b64encode
from collections.abc import Callable, Iterable
from typing import Any

from ._limits import Limits

__all__ = [
    "U64_MAX",
    "Blob",
    "Choice",
    "Flag",
    "HostName",
    "Invalid",
    "Kind",
    "Many",
    "Maybe",
    "Record",
    "Seconds",
    "Text",
    "UInt",
    "builder",
]

U64_MAX = (1 << 64) - 1


class Invalid(Exception):
    """A value does not fit its kind; `path` grows outward as the error leaves nested records and lists."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str] = []

    def where(self, root: str) -> str:
        return root + "".join(reversed(self.path))


def _name(value: object) -> str:
    return type(value).__name__


class Kind(ABC):
    """How one field is written in each codec and which values it admits."""

    __slots__ = ()

    @abstractmethod
    def dump(self, value: Any, js: bool, limits: Limits) -> Any:
        """Check a Python value and return its codec-native form (`js`: the JSON codec, else msgpack)."""

    @abstractmethod
    def load(self, value: Any, js: bool, limits: Limits) -> Any:
        """Check a codec-native value from a peer and return its Python form."""


class UInt(Kind):
    """An integer in [lo, hi]; both codecs write a plain integer (booleans are not integers here)."""

    __slots__ = ("lo", "hi")

    def __init__(self, lo: int = 0, hi: int = U64_MAX) -> None:
        self.lo = lo
        self.hi = hi

    def dump(self, value: Any, js: bool, limits: Limits) -> int:
        if type(value) is not int:
            raise Invalid(f"expected an integer, got {_name(value)}")
        if not self.lo <= value <= self.hi:
            raise Invalid(f"{value} is outside [{self.lo}, {self.hi}]")
        return value

    load = dump


class Text(Kind):
    """A string whose UTF-8 encoding is at most `getattr(limits, limit)` bytes."""

    __slots__ = ("limit",)

    def __init__(self, limit: str = "max_string") -> None:
        self.limit = limit

    def dump(self, value: Any, js: bool, limits: Limits) -> str:
        if type(value) is not str:
            raise Invalid(f"expected a string, got {_name(value)}")
        if value.isascii():
            size = len(value)
        else:
            try:
                size = len(value.encode("utf-8"))
            except UnicodeEncodeError:
                raise Invalid("string is not valid Unicode (it holds a lone surrogate)") from None
        bound = getattr(limits, self.limit)
        if size > bound:
            raise Invalid(f"string of {size} bytes exceeds {self.limit}={bound}")
        return value

    load = dump


_HOST_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_\-]{0,61}[a-z0-9_])?")


class HostName(Kind):
    """A host as the crawler keys it: lower-case ASCII (IDNA A-labels for other scripts), at most 253 bytes,
    dot-separated labels of 1-63 letters, digits, hyphens or underscores, no leading or trailing hyphen; or an
    IPv6 literal in brackets. A peer's host goes into the stores as a key, so it is held to what a URL's host
    could be after normalizing, not merely to a string length."""

    __slots__ = ()

    def dump(self, value: Any, js: bool, limits: Limits) -> str:
        if type(value) is not str:
            raise Invalid(f"expected a host name, got {_name(value)}")
        shown = repr(value[:64])
        if value.startswith("["):
            try:
                if not value.endswith("]") or "[" + ipaddress.IPv6Address(value[1:-1]).compressed + "]" != value:
                    raise ValueError
            except ValueError:
                raise Invalid(f"{shown} is not a normalized IPv6 literal") from None
            return value
        if not value or len(value) > 253:
            raise Invalid(f"a host name has 1-253 characters, got {len(value)}")
        for label in value.split("."):
            if not _HOST_LABEL.fullmatch(label):
                raise Invalid(f"{shown} is not a lower-case ASCII host name (label {label[:64]!r})")
            if label.startswith("xn--"):
                try:
                    label[4:].encode("ascii").decode("punycode")
                except UnicodeError:
                    raise Invalid(f"{shown} holds an A-label that does not decode ({label!r})") from None
        return value

    load = dump


class Choice(Kind):
    """A string from a fixed set."""

    __slots__ = ("values",)

    def __init__(self, values: Iterable[str]) -> None:
        self.values = frozenset(values)

    def dump(self, value: Any, js: bool, limits: Limits) -> str:
        if type(value) is not str or value not in self.values:
            shown = repr(value)[:64]
            raise Invalid(f"expected one of {sorted(self.values)}, got {shown}")
        return value

    load = dump


class Blob(Kind):
    """Bytes: msgpack bin, JSON standard base64 with padding. Exactly `size` bytes, or at most the limit."""

    __slots__ = ("size", "limit", "minimum")

    def __init__(self, *, size: int | None = None, limit: str | None = None, minimum: int = 0) -> None:
        self.size = size
        self.limit = limit
        self.minimum = minimum

    def _check(self, value: bytes, limits: Limits) -> bytes:
        if self.size is not None and len(value) != self.size:
            raise Invalid(f"expected exactly {self.size} bytes, got {len(value)}")
        if self.limit is not None and len(value) > getattr(limits, self.limit):
            raise Invalid(f"{len(value)} bytes exceed {self.limit}={getattr(limits, self.limit)}")
        if len(value) < self.minimum:
            raise Invalid(f"expected at least {self.minimum} bytes, got {len(value)}")
        return value

    def _bound(self, limits: Limits) -> int:
        return self.size if self.size is not None else getattr(limits, self.limit or "max_frame")

    def dump(self, value: Any, js: bool, limits: Limits) -> Any:
        if type(value) is not bytes:
            raise Invalid(f"expected bytes, got {_name(value)}")
        self._check(value, limits)
        return b64encode(value).decode("ascii") if js else value

    def load(self, value: Any, js: bool, limits: Limits) -> bytes:
        if js:
            if type(value) is not str:
                raise Invalid(f"expected a base64 string, got {_name(value)}")
            if len(value) > 4 * ((self._bound(limits) + 2) // 3):
                raise Invalid(f"base64 string of {len(value)} characters is too long")
            try:
                value = b64decode(value.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError):
                raise Invalid("not valid base64") from None
        elif type(value) is not bytes:
            raise Invalid(f"expected bytes, got {_name(value)}")
        return self._check(value, limits)


class Flag(Kind):
    """A boolean: msgpack true/false, JSON true/false (never 0 or 1)."""

    __slots__ = ()

    def dump(self, value: Any, js: bool, limits: Limits) -> bool:
        if type(value) is not bool:
            raise Invalid(f"expected a boolean, got {_name(value)}")
        return value

    load = dump


class Seconds(Kind):
    """A finite, non-negative duration in seconds; written as a float, read from a float or an integer."""

    __slots__ = ()

    def dump(self, value: Any, js: bool, limits: Limits) -> float:
        if type(value) is not float and type(value) is not int:
            raise Invalid(f"expected a number of seconds, got {_name(value)}")
        try:
            seconds = float(value)
        except OverflowError:  # an integer past 1.8e308 (JSON numbers have no size): described, not printed
            raise Invalid(f"an integer of {int(value).bit_length()} bits is not a finite number of seconds") from None
        if not math.isfinite(seconds) or seconds < 0:
            raise Invalid(f"{seconds} is not a finite, non-negative number of seconds")
        return seconds

    load = dump


class Maybe(Kind):
    """The inner kind, or nothing: msgpack nil, JSON null."""

    __slots__ = ("inner",)

    def __init__(self, inner: Kind) -> None:
        self.inner = inner

    def dump(self, value: Any, js: bool, limits: Limits) -> Any:
        return None if value is None else self.inner.dump(value, js, limits)

    def load(self, value: Any, js: bool, limits: Limits) -> Any:
        return None if value is None else self.inner.load(value, js, limits)


class Many(Kind):
    """A list of the inner kind with at most `getattr(limits, limit)` items; a tuple in Python."""

    __slots__ = ("inner", "limit")

    def __init__(self, inner: Kind, limit: str = "max_list") -> None:
        self.inner = inner
        self.limit = limit

    def _walk(self, value: Any, js: bool, limits: Limits, loading: bool) -> list[Any]:
        bound = getattr(limits, self.limit)
        if len(value) > bound:
            raise Invalid(f"list of {len(value)} items exceeds {self.limit}={bound}")
        step = self.inner.load if loading else self.inner.dump
        out = []
        for index, item in enumerate(value):
            try:
                out.append(step(item, js, limits))
            except Invalid as exc:
                exc.path.append(f"[{index}]")
                raise
        return out

    def dump(self, value: Any, js: bool, limits: Limits) -> list[Any]:
        if type(value) is not tuple:
            raise Invalid(f"expected a tuple, got {_name(value)}")
        return self._walk(value, js, limits, loading=False)

    def load(self, value: Any, js: bool, limits: Limits) -> tuple[Any, ...]:
        if type(value) is not list:
            raise Invalid(f"expected a list, got {_name(value)}")
        return tuple(self._walk(value, js, limits, loading=True))


def builder(cls: type, names: tuple[str, ...]) -> Callable[..., Any]:
    """A positional constructor for a frozen, slotted dataclass whose values are already checked.

    It fills the slots directly, which is about twice as fast as the keyword __init__ (that goes through the
    frozen class's guarded __setattr__ once per field); decoding builds thousands of these per batch.
    """
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__; build it through __init__")
    setters = tuple(getattr(cls, name).__set__ for name in names)
    # fields an older protocol version does not carry take their defaults (a field added later has one)
    missing = []
    for field in dataclasses.fields(cls):
        if field.name not in names:
            if field.default is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{field.name} is not on the wire and has no default")
            missing.append((getattr(cls, field.name).__set__, field.default))
    new = object.__new__

    def build(*values: Any) -> Any:
        obj: Any = new(cls)
        for set_slot, value in zip(setters, values, strict=True):
            set_slot(obj, value)
        for set_slot, value in missing:
            set_slot(obj, value)
        return obj

    return build


class Record(Kind):
    """A dataclass: msgpack writes an array of its fields in order, JSON an object keyed by field name."""

    __slots__ = ("cls", "fields", "names", "build")

    def __init__(self, cls: type, fields: tuple[tuple[str, Kind], ...]) -> None:
        self.cls = cls
        self.fields = fields
        self.names = frozenset(name for name, _ in fields)
        self.build = builder(cls, tuple(name for name, _ in fields))

    def dump(self, value: Any, js: bool, limits: Limits) -> Any:
        if type(value) is not self.cls:
            raise Invalid(f"expected {self.cls.__name__}, got {_name(value)}")
        out: Any = {} if js else []
        for name, kind in self.fields:
            try:
                item = kind.dump(getattr(value, name), js, limits)
            except Invalid as exc:
                exc.path.append(f".{name}")
                raise
            if js:
                out[name] = item
            else:
                out.append(item)
        return out

    def load(self, value: Any, js: bool, limits: Limits) -> Any:
        if js:
            if type(value) is not dict:
                raise Invalid(f"expected an object, got {_name(value)}")
            if value.keys() != self.names:
                missing = sorted(self.names - value.keys())
                extra = sorted(str(key)[:32] for key in value.keys() - self.names)
                raise Invalid(f"object fields differ: missing {missing}, unexpected {extra}")
            items = [value[name] for name, _ in self.fields]
        else:
            if type(value) is not list:
                raise Invalid(f"expected an array, got {_name(value)}")
            if len(value) != len(self.fields):
                raise Invalid(f"expected an array of {len(self.fields)} fields, got {len(value)}")
            items = value
        values = []
        for (name, kind), item in zip(self.fields, items, strict=True):
            try:
                values.append(kind.load(item, js, limits))
            except Invalid as exc:
                exc.path.append(f".{name}")
                raise
        return self.build(*values)
