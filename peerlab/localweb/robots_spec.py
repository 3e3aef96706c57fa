"""robots.txt as the generator knows it: structured groups and rules, rendered to text for the server.

The oracle judges a crawl from these structures, never by parsing the served text, so a bug in the
product's robots parser cannot hide behind the same bug in the referee. The matching here is a small,
separate reading of RFC 9309: the group naming the product token wins over ``*``; within a group the
longest matching pattern wins and Allow wins a tie; ``*`` matches any run of characters and a final
``$`` anchors the end; ``/robots.txt`` is always allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["RobotsGroup", "RobotsSpec", "Rule", "pattern_matches", "product_token"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One ``Allow:`` or ``Disallow:`` line."""

    allow: bool
    pattern: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RobotsGroup:
    """A group: the user-agent lines that open it, its rules and an optional Crawl-delay (seconds)."""

    agents: tuple[str, ...]
    rules: tuple[Rule, ...] = ()
    crawl_delay: float | None = None

    def render(self) -> str:
        lines = [f"User-agent: {agent}" for agent in self.agents]
        if not self.rules:
            lines.append("Disallow:")
        for rule in self.rules:
            lines.append(f"{'Allow' if rule.allow else 'Disallow'}: {rule.pattern}")
        if self.crawl_delay is not None:
            lines.append(f"Crawl-delay: {self.crawl_delay:g}")
        return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class RobotsSpec:
    """What a host answers for ``/robots.txt``.

    ``status`` 200 serves the groups; 404 means "allow all"; 500 means "disallow all"; 301 redirects to
    ``redirect_path`` on the same host, which serves the groups.
    """

    status: int = 200
    groups: tuple[RobotsGroup, ...] = ()
    redirect_path: str | None = None

    def render(self) -> bytes:
        body = "# robots.txt of the local test web\n\n" + "\n".join(g.render() for g in self.groups)
        return body.encode("utf-8")

    def group_for(self, user_agent: str) -> RobotsGroup | None:
        """The group that applies to ``user_agent``: its own product token, else ``*``, else none."""
        token = product_token(user_agent)
        star = None
        for group in self.groups:
            agents = {a.lower() for a in group.agents}
            if token in agents:
                return group
            if "*" in agents and star is None:
                star = group
        return star

    def allows(self, user_agent: str, path: str) -> bool:
        """Whether ``path`` (path and query, normalized) may be fetched by ``user_agent``."""
        if path == "/robots.txt":
            return True
        if self.status >= 500:
            return False
        if 400 <= self.status < 500:
            return True
        group = self.group_for(user_agent)
        if group is None:
            return True
        best_len = -1
        best_allow = True
        for rule in group.rules:
            if not rule.pattern or not pattern_matches(rule.pattern, path):
                continue
            length = len(rule.pattern)
            if length > best_len or (length == best_len and rule.allow):
                best_len = length
                best_allow = rule.allow
        return best_allow

    def crawl_delay(self, user_agent: str) -> float | None:
        if self.status != 200 and self.redirect_path is None:
            return None
        group = self.group_for(user_agent)
        return None if group is None else group.crawl_delay


def product_token(user_agent: str) -> str:
    """``"peercrawl/0.1 (+http://x)"`` -> ``"peercrawl"``: the part robots.txt groups are matched on."""
    head = user_agent.strip().split(None, 1)[0] if user_agent.strip() else ""
    return head.split("/", 1)[0].lower()


@lru_cache(maxsize=1024)
def _compile(pattern: str) -> re.Pattern[str]:
    anchored = pattern.endswith("$")
    body = pattern[:-1] if anchored else pattern
    regex = ".*".join(re.escape(part) for part in body.split("*"))
    return re.compile(regex + ("$" if anchored else ""), re.DOTALL)


def pattern_matches(pattern: str, path: str) -> bool:
    """Whether a robots.txt path pattern matches ``path`` from its start."""
    return _compile(pattern).match(path) is not None
