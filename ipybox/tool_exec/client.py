"""`ipybox.tool_exec.client`: the published import path, kept; the code lives in [ipybox.in_kernel.tool_runner][ipybox.in_kernel.tool_runner]."""

from ipybox.in_kernel.tool_runner import SERVER_ENV as SERVER_ENV
from ipybox.in_kernel.tool_runner import TOKEN_ENV as TOKEN_ENV
from ipybox.in_kernel.tool_runner import ApprovalRejectedError as ApprovalRejectedError
from ipybox.in_kernel.tool_runner import ApprovalTimeoutError as ApprovalTimeoutError
from ipybox.in_kernel.tool_runner import ToolRunner as ToolRunner
from ipybox.in_kernel.tool_runner import ToolRunnerError as ToolRunnerError

__all__ = [
    "SERVER_ENV",
    "TOKEN_ENV",
    "ApprovalRejectedError",
    "ApprovalTimeoutError",
    "ToolRunner",
    "ToolRunnerError",
]
