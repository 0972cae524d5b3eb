"""`IpyboxError`, the root of every exception ipybox raises, and the inner nodes of its tree.

Catch `IpyboxError` for "ipybox could not do it, and the message says why"; anything else escaping
ipybox is a bug in ipybox (the `ipybox` command prints those with their traceback, and an
`IpyboxError` as one line).

The tree (leaf classes live in the module that raises them and are importable from there; the last
column is the builtin base each keeps, so `except ValueError` / `except RuntimeError` /
`except TimeoutError` written against earlier versions still catch them):

    IpyboxError                          ipybox.errors
    ├── ConfigError                      ipybox.config                       ValueError
    ├── SecretError                      ipybox.config.secrets               ValueError
    ├── ListenError                      ipybox.asgi_server                  OSError
    ├── RuleWriteError                   ipybox.config.rule_writer           ValueError
    ├── RuleEditError                    ipybox.config.rule_edit             ValueError
    ├── ServerWriteError                 ipybox.config.server_writer         ValueError
    ├── ServerImportError                ipybox.config.server_import         ValueError
    ├── DomainWriteError                 ipybox.config.domain_writer         ValueError
    ├── LockFileError                    ipybox.config.tool_lock             ValueError
    ├── SandboxUnavailableError          ipybox.sandbox                      RuntimeError
    ├── SandboxPolicyError               ipybox.sandbox.policy               ValueError
    ├── InterceptionError                ipybox.sandbox.interception         RuntimeError
    ├── LimitUnavailableError            ipybox.limits.enforcement           RuntimeError
    ├── SeccompUnavailableError          ipybox.limits.seccomp               OSError
    ├── KernelError                      ipybox.errors
    │   ├── GatewayStartError            ipybox.kernels.gateway              RuntimeError
    │   ├── GatewayError                 ipybox.kernels.kernel_connection    RuntimeError
    │   │   ├── GatewayUnreachableError  ipybox.kernels.kernel_connection    RuntimeError
    │   │   ├── KernelStartError         ipybox.kernels.kernel_connection    RuntimeError
    │   │   │   └── KernelSetupError     ipybox.kernels.remote_setup         RuntimeError
    │   │   └── PoolStoppedError         ipybox.kernels.pool                 RuntimeError
    │   ├── KernelDied                   ipybox.kernels.kernel_connection
    │   ├── ExecutionTimeoutError        ipybox.kernels.kernel_client        TimeoutError
    │   └── CodeExecutionError           ipybox.kernels.result
    │       ├── KernelDiedError          ipybox.kernels.result
    │       └── ResourceLimitError       ipybox.kernels.result
    ├── MCPServerError                   ipybox.mcp_client.errors
    │   ├── ServerParamsError            ipybox.mcp_client.errors
    │   ├── ServerStartError             ipybox.mcp_client.errors
    │   │   └── ServerCodeWritableError  ipybox.mcp_client.errors
    │   ├── ServerConnectError           ipybox.mcp_client.errors
    │   │   └── ServerMemoryLimitError   ipybox.mcp_client.errors
    │   ├── ServerTimeoutError           ipybox.mcp_client.errors
    │   │   └── CallTimeoutError         ipybox.mcp_client.errors
    │   ├── ResultTooLargeError          ipybox.mcp_client.errors
    │   ├── ServerNotRunningError        ipybox.mcp_client.errors
    │   ├── ToolChangedError             ipybox.mcp_client.errors
    │   └── ToolCallError                ipybox.mcp_client.errors
    ├── UnknownServerError               ipybox.mcp_client.pool              LookupError
    │   └── ForeignPackageRootError      ipybox.mcp_client.pool              LookupError
    ├── NotALiteralError                 ipybox.mcp_apigen.literals          ValueError
    ├── CodeActionError                  ipybox.codeact.actions              ValueError
    ├── CheckOutputError                 ipybox.codeact.checks               ValueError
    ├── ShellSyntaxError                 ipybox.rules.shell_commands         ValueError
    ├── ModuleRefusedError               ipybox.tool_server.module_sources   ValueError
    ├── CertificateError                 ipybox.tool_server.tls              ValueError
    ├── ConnectError                     ipybox.cli.client_config            ValueError
    │   ├── BadFileError                 ipybox.cli.client_config            ValueError
    │   └── ConflictError                ipybox.cli.client_config            ValueError
    ├── NoEndpointError                  ipybox.cli.connect                  RuntimeError
    ├── CommandLineError                 ipybox.devtools.docs                ValueError
    ├── ApprovalFailedError              ipybox.errors
    │   ├── ApprovalRejected             ipybox.approval.channel
    │   └── ApprovalMessageError         ipybox.approval.wire                ValueError
    ├── WorkspaceError                   ipybox.errors
    │   ├── AlreadyRunningError          ipybox.running.state                RuntimeError
    │   ├── NotRunningError              ipybox.running.state                RuntimeError
    │   ├── ControlRequestError          ipybox.running.control_client       RuntimeError
    │   ├── ServeRefusedError            ipybox.supervisor.mcp_stdio         RuntimeError
    │   └── UnknownLeaseError            ipybox.supervisor.leases            KeyError
    └── UnsafePathError                  ipybox.errors
        ├── LinkInPathError              ipybox.safefs                       OSError
        ├── StateDirError                ipybox.running.state                ValueError
        ├── SymlinkRefusedError          ipybox.mcp_apigen.package           OSError
        ├── UnsafeRegistryError          ipybox.mcp_client.registry          PermissionError
        └── UnsafeTokenDirError          ipybox.kernel_mgr.token_file        PermissionError

`tests/test_errors.py` parses this drawing and checks it against the code: every public exception class
in ipybox is drawn, under its parent, with its module and builtin base.

Not in the tree, by design:
- The exceptions of `ipybox.in_kernel` (`ToolRunnerError` and its subclasses). They are raised inside
  kernels, to the code that runs there, and `ipybox.in_kernel` imports nothing of ipybox outside
  itself, so that a kernel starts without loading the host's package.
- Private exceptions a module raises and catches itself (e.g. the sandbox proxy's `_Refused`).
- `ValueError` / `RuntimeError` / `TypeError` raised for a misuse of the Python API (a bad argument,
  a method called in the wrong state): those are mistakes in the calling code, not conditions to handle.

Contract: this module is in the base layer and imports nothing but the standard library (nothing
else of ipybox), so every layer can use it. Its classes define no constructor: each leaf keeps its own
signature and attributes.
"""

from __future__ import annotations

__all__ = ["ApprovalFailedError", "IpyboxError", "KernelError", "UnsafePathError", "WorkspaceError"]


class IpyboxError(Exception):
    """Root of every exception ipybox raises: ipybox could not do what was asked; `str(error)` says why
    (and, where it can, what to do about it)."""


class KernelError(IpyboxError):
    """A kernel, the gateway that runs kernels, or the code executed in a kernel failed or timed out."""


class ApprovalFailedError(IpyboxError):
    """Approving a tool call failed: the call was rejected, or an approval message was malformed.

    (Not `ApprovalError`: that is the approval wire's JSON-RPC error message, `ipybox.approval.wire`.)
    """


class WorkspaceError(IpyboxError):
    """A running workspace (its supervisor) is not in the state the operation needs: already running,
    not running, or not holding the lease asked about."""


class UnsafePathError(IpyboxError):
    """A file or directory ipybox would read or write is not what ipybox made there (a symlink, a hard
    link, another owner, writable by others): ipybox refuses to use it, since a kernel that could write
    in the workspace may have planted it."""
