"""`python -m ipybox.mcp_server`: ipybox 0.9's way to start its MCP server, kept: it runs `ipybox mcp` with
the same options (`--workspace`, `--sandbox`, `--sandbox-config`, `--log-level`, and the accepted, unused
`--tool-server-host/-port`, `--kernel-gateway-host/-port`).

The one import of this layer from the command line above it (a published entry point; import-linter lets
this module, and only it, do so).
"""

from __future__ import annotations

import sys


def main() -> int:
    """Run `ipybox mcp` with this process's arguments; its exit status."""
    from ipybox.cli.main import main as cli_main

    return cli_main(["mcp", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
