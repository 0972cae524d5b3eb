"""`ipybox.code_exec.result`: the published import path, kept; the code lives in [ipybox.kernels.result][ipybox.kernels.result]."""

from ipybox.kernels.result import CodeExecutionChunk as CodeExecutionChunk
from ipybox.kernels.result import CodeExecutionError as CodeExecutionError
from ipybox.kernels.result import CodeExecutionResult as CodeExecutionResult
from ipybox.kernels.result import KernelDiedError as KernelDiedError
from ipybox.kernels.result import StreamName as StreamName

__all__ = [
    "CodeExecutionChunk",
    "CodeExecutionError",
    "CodeExecutionResult",
    "KernelDiedError",
    "StreamName",
]
