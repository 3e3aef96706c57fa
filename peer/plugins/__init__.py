"""Plug-ins: URL filters, page filters, extractors and item sinks; the one module a plug-in's author imports.

A plug-in is a class with one of ``filter(source_url, url, link)``, ``decide(page)``, ``extract(page)`` or
``write(items)``; it is named in the node's TOML configuration as ``[[plugins]] use = "module:Class"`` with its
own settings beside. docs/plugins.md is the guide; the built-ins are `RuleExtractor`, `MainTextExtractor` and
`ContentFilter`, and `JsonLinesSink` is where items go by default (DATA_DIR/items/).
"""

from peer.plugins._api import Decision, Extractor, FetchedPage, ItemSink, Link, PageFilter, UrlFilter
from peer.plugins._builtins import ContentFilter, MainTextExtractor, page_language
from peer.plugins._chain import Chain, Outcome, PluginError, PluginSpec, describe_difference, load_chain, spec_of
from peer.plugins._rules import RuleExtractor
from peer.plugins._running import Plugins
from peer.plugins._sink import ItemExporter, JsonLinesSink, read_items

__all__ = [
    "Chain", "ContentFilter", "Decision", "Extractor", "FetchedPage", "ItemExporter", "ItemSink", "JsonLinesSink",
    "Link", "MainTextExtractor", "Outcome", "PageFilter", "PluginError", "PluginSpec", "Plugins", "RuleExtractor",
    "UrlFilter", "describe_difference", "load_chain", "page_language", "read_items", "spec_of",
]
