"""The daemon: crawl engine, cluster, control API and CLI, composed under trio."""
