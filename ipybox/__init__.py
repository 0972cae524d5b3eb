"""ipybox: a sandboxed, stateful Python code-execution environment with programmatic MCP tool calling.

The public names are imported lazily, so that processes which only need a small part of the package
(the kernel gateway launcher, generated tool modules inside a kernel) do not pay for the rest.

Example:
    ```python
    from ipybox import CodeExecutor

    async with CodeExecutor() as executor:
        result = await executor.execute("print('hello')")
        assert result.text == "hello"
    ```
"""

from __future__ import annotations

import importlib

# Not `from typing import ...`: processes that need a small part of the package (the kernel launcher runs
# for every kernel start) would pay for importing typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ipybox.approval.request import ApprovalRequest
    from ipybox.codeact.actions import CodeActionError, SavedAction
    from ipybox.executor.code_executor import CodeExecutor
    from ipybox.kernels.result import (
        CodeExecutionChunk,
        CodeExecutionError,
        CodeExecutionResult,
        ResourceLimitError,
    )
    from ipybox.limits import ResourceLimits
    from ipybox.mcp_apigen import generate_mcp_sources

__version__ = "0.10.0.dev0"

_EXPORTS: dict[str, str] = {
    "CodeExecutor": "ipybox.executor.code_executor",
    "CodeExecutionResult": "ipybox.kernels.result",
    "CodeExecutionChunk": "ipybox.kernels.result",
    "CodeExecutionError": "ipybox.kernels.result",
    "ResourceLimitError": "ipybox.kernels.result",
    "ResourceLimits": "ipybox.limits.spec",
    "generate_mcp_sources": "ipybox.mcp_apigen",
    "ApprovalRequest": "ipybox.approval.request",
    "CodeActionError": "ipybox.codeact.actions",
    "SavedAction": "ipybox.codeact.actions",
}

__all__ = [
    "ApprovalRequest",
    "CodeActionError",
    "CodeExecutionChunk",
    "CodeExecutionError",
    "CodeExecutionResult",
    "CodeExecutor",
    "ResourceLimitError",
    "ResourceLimits",
    "SavedAction",
    "generate_mcp_sources",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ipybox' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
