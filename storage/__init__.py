"""Synchronous node state: dedup store, frontier store, page store, caches. Never imports peer."""
