"""What a remote kernel is told, and what its start request carries: the token and the address only ever
in the set-up (a silent execution), the start request only `KERNEL_*` variables."""

from __future__ import annotations

import ast
import json

from ipybox.executor.remote_kernels import remote_limits_env, remote_start_env
from ipybox.in_kernel.remote import PROTOCOL
from ipybox.kernels.remote_setup import _INSTALL, RemoteKernelSetup
from ipybox.limits import ResourceLimits, WorkspaceLimits

SETUP = RemoteKernelSetup(
    calls_address="tls://tools.example:7450",
    certificate_pem="-----BEGIN CERTIFICATE-----\nMII...\n-----END CERTIFICATE-----\n",
    module_roots={"mcptools": "/ws/mcptools", "gentools": "/ws/gentools", "mcpparse": "/ws/mcpparse"},
    env={"API_BASE": "http://x", "IPYBOX_SHELL_APPROVAL": "ask"},
    shell_approval=True,
)


def test_the_payload_carries_the_token_the_pin_the_roots_and_the_protocol() -> None:
    payload = json.loads(SETUP.payload("tok-123"))
    assert payload["protocol"] == PROTOCOL and payload["token"] == "tok-123"
    assert payload["server"] == "tls://tools.example:7450"
    assert payload["cert"].startswith("-----BEGIN CERTIFICATE-----")
    assert payload["roots"]["gentools"] == "/ws/gentools"
    assert payload["extensions"] == {"shell_approval": True, "cwd": None}
    assert payload["env"]["API_BASE"] == "http://x"


def test_the_set_up_cell_names_nothing_in_the_users_namespace() -> None:
    code = _INSTALL.format(payload=SETUP.payload("tok"))
    assert code.startswith("exec(") and code.endswith("})")  # its own namespace dict
    compile(code, "<set-up>", "exec")  # a quote or newline in the payload cannot break out of the literal


def test_a_payload_with_quotes_and_newlines_stays_one_literal() -> None:
    hostile = RemoteKernelSetup("tls://h:1", "pem", env={"X": "')\nimport os; os.system('x')#"})
    code = _INSTALL.format(payload=hostile.payload("t"))
    tree = ast.parse(code)
    assert len(tree.body) == 1  # one expression: exec(...), whatever the payload holds


def test_the_start_request_carries_only_kernel_variables_and_never_the_token() -> None:
    env = remote_start_env(WorkspaceLimits())
    assert all(name.startswith("KERNEL_") for name in env)
    assert env["KERNEL_MEMORY_LIMIT"] == str(4 * 1024**3) and "KERNEL_USERNAME" in env
    assert remote_limits_env(ResourceLimits(cpus=1.5)) == {"KERNEL_CPUS_LIMIT": "1.5"}
    assert remote_limits_env(ResourceLimits()) == {}
