"""Benchmark harness for ipybox: ours side by side with the published ipybox 0.9.2 ("the peer").

Run it from the repository root: ``.venv/bin/python -m bench <suite>... [--peer] [--runs N]``.
See ``bench/README.md``.
"""
