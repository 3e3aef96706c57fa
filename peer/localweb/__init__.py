"""A local web for tests, the demo and benchmarks: a generated site graph, its HTTP server and DNS server."""
