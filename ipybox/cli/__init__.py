"""The `ipybox` command line."""

from ipybox.cli.main import main

__all__ = ["main"]
