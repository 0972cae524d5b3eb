"""`ipybox.code_exec.client`: the published import path, kept; the code lives in [ipybox.kernels.kernel_client][ipybox.kernels.kernel_client]."""

from ipybox.kernels.gateway import GatewayEndpoint as GatewayEndpoint
from ipybox.kernels.kernel_client import DEFAULT_MAX_OUTPUT_CHARS as DEFAULT_MAX_OUTPUT_CHARS
from ipybox.kernels.kernel_client import ExecutionError as ExecutionError
from ipybox.kernels.kernel_client import ExecutionResult as ExecutionResult
from ipybox.kernels.kernel_client import ExecutionTimeoutError as ExecutionTimeoutError
from ipybox.kernels.kernel_client import KernelClient as KernelClient
from ipybox.kernels.kernel_connection import GatewayError as GatewayError
from ipybox.kernels.kernel_connection import GatewayUnreachableError as GatewayUnreachableError
from ipybox.kernels.kernel_connection import KernelConnection as KernelConnection
from ipybox.kernels.kernel_connection import KernelDied as KernelDied
from ipybox.kernels.kernel_connection import KernelMessage as KernelMessage
from ipybox.kernels.kernel_connection import KernelStartError as KernelStartError
from ipybox.kernels.kernel_connection import gateway_down as gateway_down
from ipybox.kernels.output import OutputCollector as OutputCollector
from ipybox.kernels.output import strip_ansi as strip_ansi
from ipybox.kernels.result import CodeExecutionChunk as CodeExecutionChunk
from ipybox.kernels.result import CodeExecutionError as CodeExecutionError
from ipybox.kernels.result import CodeExecutionResult as CodeExecutionResult
from ipybox.kernels.result import KernelDiedError as KernelDiedError
from ipybox.kernels.result import StreamName as StreamName
from ipybox.kernels.timer import ExecutionTimer as ExecutionTimer

__all__ = [
    "DEFAULT_MAX_OUTPUT_CHARS",
    "CodeExecutionChunk",
    "CodeExecutionError",
    "CodeExecutionResult",
    "ExecutionError",
    "ExecutionResult",
    "ExecutionTimeoutError",
    "ExecutionTimer",
    "GatewayEndpoint",
    "GatewayError",
    "GatewayUnreachableError",
    "KernelClient",
    "KernelConnection",
    "KernelDied",
    "KernelDiedError",
    "KernelMessage",
    "KernelStartError",
    "OutputCollector",
    "StreamName",
    "gateway_down",
    "strip_ansi",
]
