"""`ipybox.facade`: the published import path, kept; the code lives in [ipybox.executor.code_executor][ipybox.executor.code_executor]."""

from ipybox.approval.request import ApprovalRequest as ApprovalRequest
from ipybox.executor.code_executor import CodeExecutor as CodeExecutor
from ipybox.executor.code_executor import StreamItem as StreamItem
from ipybox.kernels.gateway import GatewayEndpoint as GatewayEndpoint
from ipybox.kernels.gateway import KernelGateway as KernelGateway
from ipybox.kernels.kernel_client import DEFAULT_MAX_OUTPUT_CHARS as DEFAULT_MAX_OUTPUT_CHARS
from ipybox.kernels.kernel_client import KernelClient as KernelClient
from ipybox.kernels.kernelspec import KernelSpec as KernelSpec
from ipybox.kernels.result import CodeExecutionChunk as CodeExecutionChunk
from ipybox.kernels.result import CodeExecutionResult as CodeExecutionResult
from ipybox.mcp_client.registry import ServerRegistry as ServerRegistry
from ipybox.tool_server.tool_server import ToolServer as ToolServer

__all__ = [
    "DEFAULT_MAX_OUTPUT_CHARS",
    "ApprovalRequest",
    "CodeExecutionChunk",
    "CodeExecutionResult",
    "CodeExecutor",
    "GatewayEndpoint",
    "KernelClient",
    "KernelGateway",
    "KernelSpec",
    "ServerRegistry",
    "StreamItem",
    "ToolServer",
]
