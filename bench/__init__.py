"""Benchmark: the bridge against the server's own durable sourcing, on the same machine, in one run.

``python -m bench run`` (see ``bench/README.md``).
"""
