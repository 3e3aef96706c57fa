"""Pages that need JavaScript: a headless chromium driven over the DevTools protocol, every request it makes
served by the node, and the decision of when a page is worth rendering (docs/rendering.md)."""

from peer.render.browser import (Browser, BrowserError, clear_workdir, find_chromium, group_rss, open_browser,
                                 pids_of_group)
from peer.render.cdp import Cdp, CdpClosed, CdpError, CdpOverflow, Event, MessageStream
from peer.render.pool import PoolLimits, RenderPool
from peer.render.tabs import BrowserRequest, RenderFailed, Rendered, Served, render_in_tab

__all__ = [
    "Browser", "BrowserError", "BrowserRequest", "Cdp", "CdpClosed", "CdpError", "CdpOverflow", "Event",
    "MessageStream", "PoolLimits", "RenderFailed", "RenderPool", "Rendered", "Served", "clear_workdir",
    "find_chromium", "group_rss", "open_browser", "pids_of_group", "render_in_tab",
]
