"""Every import path that the README or the reference docs publish keeps working, as a re-export of the
object where the code now lives.

`PUBLIC` is the list: for each published module, each published name and the module that defines it. A
name must import from the published path and be the very object at its home (not a copy, not a subclass),
so `isinstance` and `except` work whichever path an application imported it from. The re-export modules
(`ipybox.code_exec.*`, `ipybox.tool_exec.*`, `ipybox.facade`, `ipybox.workspace`) must also export exactly
their `__all__`.

`ipybox.tool_exec.client` is imported by every generated tool module, inside every kernel, sandboxed ones
included: it must load the standard library and `ipybox.in_kernel` only.

ipybox 0.9's `ipybox.kernel_mgr.*` and `ipybox.mcp_server.MCPServer` are thin classes of their own over
ipybox's (`ExecutionResult` and `ExecutionError` are ipybox's result and error classes themselves).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

# (published module, {name: module that defines it}).
PUBLIC: list[tuple[str, dict[str, str]]] = [
    (
        "ipybox",
        {
            "ApprovalRequest": "ipybox.approval.request",
            "CodeActionError": "ipybox.codeact.actions",
            "CodeExecutionChunk": "ipybox.kernels.result",
            "CodeExecutionError": "ipybox.kernels.result",
            "CodeExecutionResult": "ipybox.kernels.result",
            "CodeExecutor": "ipybox.executor.code_executor",
            "ResourceLimitError": "ipybox.kernels.result",
            "ResourceLimits": "ipybox.limits.spec",
            "SavedAction": "ipybox.codeact.actions",
            "generate_mcp_sources": "ipybox.mcp_apigen.sources",
        },
    ),
    ("ipybox.code_exec", {"CodeExecutor": "ipybox.executor.code_executor"}),
    (
        "ipybox.code_exec.server",
        {
            "KERNEL_NAME": "ipybox.kernels.kernelspec",
            "READY_PREFIX": "ipybox.kernels.gateway_main",
            "GatewayEndpoint": "ipybox.kernels.gateway",
            "GatewayStartError": "ipybox.kernels.gateway",
            "KernelGateway": "ipybox.kernels.gateway",
            "KernelSpec": "ipybox.kernels.kernelspec",
            "kernel_base_env": "ipybox.kernels.gateway",
        },
    ),
    (
        "ipybox.code_exec.client",
        {
            "DEFAULT_MAX_OUTPUT_CHARS": "ipybox.kernels.kernel_client",
            "CodeExecutionChunk": "ipybox.kernels.result",
            "CodeExecutionError": "ipybox.kernels.result",
            "CodeExecutionResult": "ipybox.kernels.result",
            "ExecutionError": "ipybox.kernels.kernel_client",
            "ExecutionResult": "ipybox.kernels.kernel_client",
            "ExecutionTimeoutError": "ipybox.kernels.kernel_client",
            "ExecutionTimer": "ipybox.kernels.timer",
            "GatewayEndpoint": "ipybox.kernels.gateway",
            "GatewayError": "ipybox.kernels.kernel_connection",
            "GatewayUnreachableError": "ipybox.kernels.kernel_connection",
            "KernelClient": "ipybox.kernels.kernel_client",
            "KernelConnection": "ipybox.kernels.kernel_connection",
            "KernelDied": "ipybox.kernels.kernel_connection",
            "KernelDiedError": "ipybox.kernels.result",
            "KernelMessage": "ipybox.kernels.kernel_connection",
            "KernelStartError": "ipybox.kernels.kernel_connection",
            "OutputCollector": "ipybox.kernels.output",
            "StreamName": "ipybox.kernels.result",
            "gateway_down": "ipybox.kernels.kernel_connection",
            "strip_ansi": "ipybox.kernels.output",
        },
    ),
    (
        "ipybox.code_exec.result",
        {
            "CodeExecutionChunk": "ipybox.kernels.result",
            "CodeExecutionError": "ipybox.kernels.result",
            "CodeExecutionResult": "ipybox.kernels.result",
            "KernelDiedError": "ipybox.kernels.result",
            "StreamName": "ipybox.kernels.result",
        },
    ),
    (
        "ipybox.tool_exec.server",
        {
            "ToolServer": "ipybox.tool_server.tool_server",
            "ApprovalChannel": "ipybox.approval.channel",
            "MCPServers": "ipybox.mcp_client.pool",
            "MCPServerError": "ipybox.mcp_client.errors",
            "ToolCallError": "ipybox.mcp_client.errors",
        },
    ),
    (
        "ipybox.tool_exec.client",
        {
            "SERVER_ENV": "ipybox.in_kernel.tool_runner",
            "TOKEN_ENV": "ipybox.in_kernel.tool_runner",
            "ApprovalRejectedError": "ipybox.in_kernel.tool_runner",
            "ApprovalTimeoutError": "ipybox.in_kernel.tool_runner",
            "ToolRunner": "ipybox.in_kernel.tool_runner",
            "ToolRunnerError": "ipybox.in_kernel.tool_runner",
        },
    ),
    (
        "ipybox.tool_exec.approval",
        {
            "ApprovalChannel": "ipybox.approval.channel",
            "ApprovalClient": "ipybox.approval.approval_client",
            "ApprovalRequest": "ipybox.approval.request",
        },
    ),
    (
        "ipybox.tool_exec.approval.server",
        {"ApprovalChannel": "ipybox.approval.channel", "ApprovalRequest": "ipybox.approval.request"},
    ),
    (
        "ipybox.tool_exec.approval.client",
        {
            "ApprovalCallback": "ipybox.approval.approval_client",
            "ApprovalClient": "ipybox.approval.approval_client",
            "ApprovalRequest": "ipybox.approval.request",
        },
    ),
    ("ipybox.tool_exec.approval.request", {"ApprovalRequest": "ipybox.approval.request"}),
    (
        "ipybox.facade",
        {
            "ApprovalRequest": "ipybox.approval.request",
            "CodeExecutionChunk": "ipybox.kernels.result",
            "CodeExecutionResult": "ipybox.kernels.result",
            "CodeExecutor": "ipybox.executor.code_executor",
            "KernelClient": "ipybox.kernels.kernel_client",
            "KernelGateway": "ipybox.kernels.gateway",
            "ToolServer": "ipybox.tool_server.tool_server",
        },
    ),
    (
        "ipybox.workspace",
        {
            "CONFIG_FILE": "ipybox.config.loading",
            "ConfigError": "ipybox.config.errors",
            "ConfigProblem": "ipybox.config.errors",
            "ServerSection": "ipybox.config.servers",
            "WorkspaceConfig": "ipybox.config.workspace_config",
            "check_server_name": "ipybox.config.servers",
            "load_config": "ipybox.config.loading",
        },
    ),
    # The new homes the README names.
    ("ipybox.kernels.gateway", {"KernelGateway": "ipybox.kernels.gateway"}),
    (
        "ipybox.kernels.kernel_client",
        {
            "KernelClient": "ipybox.kernels.kernel_client",
            "ExecutionTimeoutError": "ipybox.kernels.kernel_client",
            "KernelDiedError": "ipybox.kernels.result",
            "KernelStartError": "ipybox.kernels.kernel_connection",
            "GatewayUnreachableError": "ipybox.kernels.kernel_connection",
        },
    ),
    (
        "ipybox.in_kernel.tool_runner",
        {
            "ApprovalRejectedError": "ipybox.in_kernel.tool_runner",
            "ApprovalTimeoutError": "ipybox.in_kernel.tool_runner",
            "ToolRunnerError": "ipybox.in_kernel.tool_runner",
        },
    ),
    ("ipybox.tool_server.tool_server", {"ToolServer": "ipybox.tool_server.tool_server"}),
    (
        "ipybox.executor.options",
        {"EmbeddedOptions": "ipybox.executor.options", "ExternalGateway": "ipybox.executor.options"},
    ),
    ("ipybox.approval.approval_client", {"ApprovalClient": "ipybox.approval.approval_client"}),
    ("ipybox.mcp_apigen", {"generate_mcp_sources": "ipybox.mcp_apigen.sources"}),
    (
        "ipybox.mcp_server",
        {"create_server": "ipybox.mcp_server.workspace_mcp", "MCPServer": "ipybox.cli.mcp_compat"},
    ),
    (
        "ipybox.config",
        {
            "RuleWriteError": "ipybox.config.rule_writer",
            "WrittenRule": "ipybox.config.rule_writer",
            "write_answer_rule": "ipybox.config.rule_writer",
            "ServerEdit": "ipybox.config.server_writer",
            "ServerWriteError": "ipybox.config.server_writer",
            "remove_server": "ipybox.config.server_writer",
            "write_server": "ipybox.config.server_writer",
        },
    ),
    ("ipybox.rules", {"AuditFilter": "ipybox.rules.audit", "AuditPage": "ipybox.rules.audit"}),
    # ipybox 0.9's paths, thin classes over the above.
    ("ipybox.kernel_mgr.server", {"KernelGateway": "ipybox.kernel_mgr.server"}),
    (
        "ipybox.kernel_mgr.client",
        {
            "KernelClient": "ipybox.kernel_mgr.client",
            "ExecutionResult": "ipybox.kernels.kernel_client",
            "ExecutionError": "ipybox.kernels.kernel_client",
        },
    ),
    ("ipybox.utils", {"arun": "ipybox.utils"}),
    (
        "ipybox.supervisor",
        {
            "Supervisor": "ipybox.supervisor.supervisor",
            "AlreadyRunningError": "ipybox.running.state",
            "NotRunningError": "ipybox.running.state",
            "read_state": "ipybox.running.state",
        },
    ),
    (
        "ipybox.sandbox",
        {
            "SandboxPolicy": "ipybox.sandbox.policy",
            "DomainProxy": "ipybox.sandbox.proxy",
            "check_sandbox": "ipybox.sandbox.platforms",
            "SandboxUnavailableError": "ipybox.sandbox.errors",
        },
    ),
]

# The modules that hold no code of their own: kept only so that published imports keep working.
REEXPORT_MODULES = [
    "ipybox.code_exec.server",
    "ipybox.code_exec.client",
    "ipybox.code_exec.result",
    "ipybox.tool_exec.server",
    "ipybox.tool_exec.client",
    "ipybox.tool_exec.approval",
    "ipybox.tool_exec.approval.server",
    "ipybox.tool_exec.approval.client",
    "ipybox.tool_exec.approval.request",
    "ipybox.facade",
    "ipybox.workspace",
]

# Third-party code a kernel may lack. Checked by the import below, together with every other module that is
# neither the standard library nor ipybox's in-kernel code.
TOOL_MODULE_IMPORT = """
import sys
before = set(sys.modules)
import ipybox.tool_exec.client
allowed = {"ipybox", "ipybox.tool_exec", "ipybox.tool_exec.client"}
loaded = sorted(
    m for m in set(sys.modules) - before
    if m.split(".")[0] not in sys.stdlib_module_names
    and m not in allowed
    and m != "ipybox.in_kernel" and not m.startswith("ipybox.in_kernel.")
)
print(loaded)
"""

PUBLIC_NAMES = [(module, name, home) for module, names in PUBLIC for name, home in names.items()]


@pytest.mark.parametrize(
    ("module", "name", "home"), PUBLIC_NAMES, ids=[f"{m}.{n}" for m, n, _ in PUBLIC_NAMES]
)
def test_a_published_name_is_the_object_at_its_home(module: str, name: str, home: str) -> None:
    published = importlib.import_module(module)
    assert hasattr(published, name), f"`from {module} import {name}` fails: re-export it from {home}"
    value = getattr(published, name)
    at_home = getattr(importlib.import_module(home), name, None)
    assert value is at_home, (
        f"{module}.{name} is not {home}.{name}: re-export the object (`from {home} import {name} as "
        f"{name}`) instead of defining or copying it, or correct its home in PUBLIC"
    )


@pytest.mark.parametrize("module", sorted({module for module, _ in PUBLIC}))
def test_a_published_module_with_an_all_lists_its_published_names_in_it(module: str) -> None:
    published = importlib.import_module(module)
    documented = {name for m, names in PUBLIC if m == module for name in names}
    if not hasattr(published, "__all__"):
        return  # a module of its own code, no __all__: its names are checked one by one above
    exported = set(published.__all__)
    assert documented <= exported, f"{module}.__all__ lacks {sorted(documented - exported)}"
    for name in exported:
        assert hasattr(published, name), f"{module}.__all__ names {name!r}, which the module doesn't have"


@pytest.mark.parametrize("module", REEXPORT_MODULES)
def test_a_reexport_module_exports_exactly_its_all(module: str) -> None:
    shim = importlib.import_module(module)
    bound = {
        name
        for name, value in vars(shim).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)  # its own submodules, bound on import
        and name != "annotations"  # `from __future__ import annotations`
    }
    assert bound == set(shim.__all__), (
        f"{module} binds {sorted(bound - set(shim.__all__))} outside __all__ and lacks "
        f"{sorted(set(shim.__all__) - bound)}: a re-export module holds its __all__ and nothing else"
    )


def test_every_reexport_module_is_in_the_published_list() -> None:
    assert set(REEXPORT_MODULES) <= {module for module, _ in PUBLIC}


@pytest.mark.integration  # starts an interpreter (about 50 ms)
def test_importing_the_tool_runner_path_loads_only_the_standard_library_and_in_kernel_code() -> None:
    out = subprocess.run(
        [sys.executable, "-c", TOOL_MODULE_IMPORT], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]", (
        "importing ipybox.tool_exec.client (which every generated tool module does, in every kernel) "
        f"loaded {out.strip()}; keep ipybox.tool_exec and ipybox/__init__ free of eager imports"
    )
