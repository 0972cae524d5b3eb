"""`ipybox.code_exec`: the published import paths of the kernel gateway and kernel client, kept.

The code lives in [kernels][ipybox.kernels]; `CodeExecutor` (importable from here, as in ipybox 0.9) in
[executor][ipybox.executor].
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ipybox.executor.code_executor import CodeExecutor

__all__ = ["CodeExecutor"]


def __getattr__(name: str) -> Any:
    # Lazy: `ipybox.code_exec.client` must not import the whole SDK.
    if name == "CodeExecutor":
        return importlib.import_module("ipybox.executor.code_executor").CodeExecutor
    raise AttributeError(f"module 'ipybox.code_exec' has no attribute {name!r}")
