"""What importing ipybox loads: constructing an executor, or reading a workspace's configuration, must not
load the MCP SDK (it takes longer to import than the rest of ipybox together) or the HTTP client.

Each check runs in a fresh interpreter and looks at `sys.modules`, not at the clock: how long the import
takes is a bench figure (`python -m bench startup`), never a timed assertion here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # starts interpreters (about 0.3 s each)

MCP_SDK = ("mcp", "mcp_types")


def loaded_after(statement: str, packages: tuple[str, ...]) -> list[str]:
    """Which of `packages` a fresh interpreter has in `sys.modules` after running `statement`."""
    probe = f"import json, sys\n{statement}\nprint(json.dumps([p for p in {list(packages)!r} if p in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{statement!r} failed:\n{done.stderr}"
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize(
    "statement",
    [
        "import ipybox",
        "from ipybox import CodeExecutor",
        "import ipybox.config",
        "from ipybox.config import ConfigError, load_config",
        "from ipybox.mcp_client import ServerParams, parse_server_params",
    ],
)
def test_importing_it_does_not_load_the_mcp_sdk(statement: str) -> None:
    loaded = loaded_after(statement, MCP_SDK)
    assert loaded == [], (
        f"{statement!r} loaded {loaded}: import the MCP SDK where a server is started or a result is read "
        "(see ipybox/mcp_client/__init__.py), not at the top of a module every executor imports"
    )


def test_constructing_an_executor_loads_no_http_client() -> None:
    loaded = loaded_after("from ipybox import CodeExecutor\nCodeExecutor()", (*MCP_SDK, "aiohttp"))
    assert loaded == [], f"constructing a CodeExecutor (which starts nothing) loaded {loaded}"


def test_the_check_sees_the_sdk_when_a_module_does_load_it() -> None:
    # The connection module talks MCP: it must load the SDK, and the check must see it do so.
    assert loaded_after("import ipybox.mcp_client.connection", MCP_SDK) == list(MCP_SDK)
