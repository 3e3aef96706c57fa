"""The rule extractor: items from CSS selectors and XPath per URL pattern, configured without code.

    [[plugins]]
    use = "peer.plugins:RuleExtractor"
    [[plugins.rules]]
    url = "/product/"                  # a regular expression searched in the page's URL
    type = "product"                   # the item's "type" (optional)
    required = ["name", "price"]       # no item unless these are found (default: none)
    [plugins.rules.fields]
    name = { css = "h1.name" }                                 # text (the default type)
    price = { css = ".price", type = "number" }
    image = { css = "img.main", type = "attribute", attr = "src" }
    tags = { xpath = "//ul[@class='tags']/li", type = "list" }

The first rule whose ``url`` matches applies (one rule per page). A field is the first element its selector
finds (``list``: all of them): ``text`` its text with whitespace collapsed, ``attribute`` the value of ``attr``,
``number`` the first number in its text (``1,299.00`` is 1299.0), ``list`` the texts (or ``attr`` values) of
all. A field not found is null; an item whose required fields are not all found is not made.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from cssselect import GenericTranslator, SelectorError
from lxml import etree

from peer.plugins._api import FetchedPage

__all__ = ["RuleExtractor"]

_TYPES = ("text", "attribute", "number", "list")
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")


class _Field:
    __slots__ = ("attr", "kind", "name", "path")

    def __init__(self, rule: int, name: str, spec: Any) -> None:
        where = f"rules[{rule}].fields.{name}"
        if isinstance(spec, str):
            spec = {"css": spec}
        if not isinstance(spec, Mapping):
            raise ValueError(f"{where}: a field is a CSS selector or a table with css or xpath")
        unknown = set(spec) - {"css", "xpath", "type", "attr"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        if ("css" in spec) == ("xpath" in spec):
            raise ValueError(f"{where}: give exactly one of css or xpath")
        self.name = name
        self.kind = spec.get("type", "text")
        if self.kind not in _TYPES:
            raise ValueError(f"{where}: type must be one of {', '.join(_TYPES)}, got {self.kind!r}")
        self.attr = spec.get("attr")
        if self.kind == "attribute" and not self.attr:
            raise ValueError(f"{where}: type attribute needs attr")
        try:
            expr = GenericTranslator().css_to_xpath(spec["css"]) if "css" in spec else spec["xpath"]
            self.path = etree.XPath(expr)
        except (SelectorError, etree.XPathError, TypeError) as exc:
            raise ValueError(f"{where}: bad selector: {exc}") from exc

    def value(self, root: Any) -> Any:
        answer = self.path(root)
        # an XPath giving a string, a number or a boolean is one value
        found: list[Any] = answer if isinstance(answer, list) else [answer]
        if self.kind == "list":
            return [v for v in (self._one(x, self.attr) for x in found) if v is not None]
        for x in found:
            v = self._one(x, self.attr if self.kind == "attribute" else None)
            if v is None:
                continue
            if self.kind == "number":
                match = _NUMBER.search(v)
                if match is None:
                    continue
                return float(match.group().replace(",", ""))
            return v
        return None

    @staticmethod
    def _one(x: Any, attr: str | None) -> str | None:
        if isinstance(x, etree._Element):
            text = x.get(attr) if attr else " ".join("".join(x.itertext()).split())  # type: ignore[arg-type]  # lxml-stubs: itertext may give bytes; an HTML tree gives str
        elif isinstance(x, (str, bytes, int, float)):
            text = " ".join(str(x).split())
        else:
            return None
        return text if text else None


class _Rule:
    __slots__ = ("fields", "required", "type", "url")

    def __init__(self, index: int, spec: Any) -> None:
        if not isinstance(spec, Mapping):
            raise ValueError(f"rules[{index}]: a rule is a table")
        unknown = set(spec) - {"url", "type", "fields", "required"}
        if unknown:
            raise ValueError(f"rules[{index}]: unknown keys {sorted(unknown)}")
        try:
            self.url = re.compile(spec.get("url", ""))
        except re.error as exc:
            raise ValueError(f"rules[{index}].url: {exc}") from exc
        self.type = spec.get("type")
        fields = spec.get("fields")
        if not isinstance(fields, Mapping) or not fields:
            raise ValueError(f"rules[{index}]: fields is a table of at least one field")
        self.fields = [_Field(index, name, f) for name, f in fields.items()]
        self.required = list(spec.get("required", ()))
        missing = set(self.required) - set(fields)
        if missing:
            raise ValueError(f"rules[{index}]: required names fields it does not have: {sorted(missing)}")


class RuleExtractor:
    """One item per page from the first rule whose URL pattern matches (see the module's text)."""

    version = "1"
    needs_tree = True

    def __init__(self, rules: Iterable[Mapping[str, Any]]) -> None:
        self.rules = [_Rule(i, r) for i, r in enumerate(rules)]
        if not self.rules:
            raise ValueError("rules: at least one rule")

    def extract(self, page: FetchedPage) -> list[dict[str, Any]]:
        rule = next((r for r in self.rules if r.url.search(page.url)), None)
        root = page.tree if rule is not None else None
        if rule is None or root is None:
            return []
        item: dict[str, Any] = {} if rule.type is None else {"type": rule.type}
        for field in rule.fields:
            item[field.name] = field.value(root)
        if any(item.get(name) in (None, []) for name in rule.required):
            return []
        return [item]
