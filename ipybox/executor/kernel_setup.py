"""How kernels are started: one builder for `CodeExecutor`'s embedded gateway and the workspace supervisor.

Both callers describe what their kernels get in a `KernelSetup` (working directory, environment, sandbox
policy, where generated tool packages are) and call `start_kernel_gateway`, which builds the kernelspec
(sandboxed when the setup has a policy), the kernel environment and the gateway, plus the `DomainProxy`
when the policy allows domains. Nothing about kernels is decided by a caller on its own any more, so the
SDK and `ipybox up` cannot drift apart again.

The kernel environment, in order (a later source wins):

1. with `prefixed_env`: `KERNEL_ENV_X` from `dotenv` and the host's environment, as `X` (ipybox 0.9's
   workspace rule, documented for `ipybox up`);
2. `env`, with `${VAR}` placeholders filled from the host's environment or `dotenv` when
   `resolve_placeholders` is set (`[kernel] env` of `ipybox.toml`), else taken literally;
3. what the proxy's interception sets (`Interception.env`): each secret's placeholder in its variable
   (`[secrets]`: the real values stay with the proxy, on the host) and the trust variables of the
   interception CA (`SSL_CERT_FILE`, ...), set by the host over any configured ones;
4. `IPYBOX_MCPTOOLS_DIR` when `refresh_mcptools` is set (kernels re-import regenerated packages);
5. the tool server's address and, when given, the call token that all kernels share (else no token: the
   starter gives each kernel its own): last, so no variable above can point a kernel's tool calls
   elsewhere or pose as a kernel.

The host's environment itself never reaches a kernel: the gateway gives kernels `PATH`, `HOME`, `LANG`
and little else, plus the above.

Secrets and the interception CA (workspace kernels; `ipybox.config.secrets`, `ipybox.sandbox.interception`):
the caller resolves `[secrets]` on the host once and passes them in `KernelSetup.secrets`. When the sandbox
has secrets or restricted hosts (`NetworkPolicy.restricted_hosts`), `start_kernel_gateway` loads (or
makes) the workspace's CA in `interception_dir` (in ipybox's state directory, which sandboxes hide), writes
the trust bundle and the CA certificate to `trust_dir` (which kernels may read, not write), and gives the
proxy the secrets' routes and the CA. Without those two directories (the embedded executor's setup)
nothing is intercepted: no placeholder reaches a kernel and a restricted host's HTTPS is refused.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dotenv import dotenv_values

from ipybox.codeact.layout import gentools_dir
from ipybox.config import WorkspaceConfig
from ipybox.config.executables import protect, workspace_executables
from ipybox.config.secrets import ResolvedSecret
from ipybox.config.secrets import kernel_env as secrets_env
from ipybox.in_kernel.call_protocol import SERVER_ENV, TOKEN_ENV
from ipybox.in_kernel.mcptools_refresh import MCPTOOLS_DIR_ENV
from ipybox.in_kernel.shell_approval import SHELL_APPROVAL_ENV
from ipybox.in_kernel.working_dir import CWD_RESET_ENV
from ipybox.kernels.gateway import KernelGateway
from ipybox.kernels.kernelspec import KernelSpec, sandboxed_kernel_spec
from ipybox.limits import ResourceLimits
from ipybox.mcp_apigen.parsers import parsers_dir
from ipybox.mcp_client.params import resolve_placeholders as _resolve_placeholders
from ipybox.sandbox import DomainProxy, SandboxPolicy
from ipybox.sandbox.host_asks import HostAsker
from ipybox.sandbox.interception import (
    InterceptionCA,
    SecretRoute,
    trust_bundle,
    trust_env,
    write_ca_file,
)

KERNEL_ENV_PREFIX = "KERNEL_ENV_"
"""Variables of `.env` or the host named `KERNEL_ENV_X` reach kernels as `X` (with `prefixed_env`)."""

INTERCEPTION_DIR = "interception"
"""The interception CA's directory in a workspace's state directory (hidden from kernels)."""
TRUST_BUNDLE_FILE = "ca-bundle.pem"
"""In `KernelSetup.trust_dir`: the machine's CAs and the interception CA (`SSL_CERT_FILE`, ...)."""
TRUST_CA_FILE = "interception-ca.pem"
"""In `KernelSetup.trust_dir`: the interception CA alone (`NODE_EXTRA_CA_CERTS`)."""


@dataclass(frozen=True)
class KernelSetup:
    """What kernels are started with (see the module docstring for how the environment is made).

    Attributes:
        working_dir: The kernels' working directory (absolute).
        env: Environment variables for kernels.
        resolve_placeholders: Fill `${VAR}` placeholders in `env` from the host's environment or `dotenv`.
        prefixed_env: Pass `KERNEL_ENV_X` of `dotenv` and the host's environment as `X`.
        dotenv: The `.env` file read for placeholders and `KERNEL_ENV_*` (ignored when it does not exist).
        sandbox: The sandbox policy kernels run under; `None` runs them unsandboxed.
        limits: What each kernel may use (`ResourceLimits()`: nothing limited).
        limits_source: Where `limits` were set, for the error about one this machine can't enforce.
        mcptools_dir: Where the generated tool packages are (absolute).
        refresh_mcptools: Tell kernels where `mcptools_dir` is, so regenerated packages are imported anew.
        approve_shell: Kernels ask the tool server before shell commands run (`!cmd`, `%%bash`, ...).
        require_shell_escape: With `approve_shell`: kernels refuse to start processes other than through
            the `!` form (`subprocess`, `os.system`, ... raise).
        reset_cwd: Each cell starts in `working_dir` again (ipybox 0.9.2's `working_dir`).
        secrets: `[secrets]` resolved on the host: the proxy puts their values in requests to their hosts,
            kernels get their placeholders (only when the setup intercepts: see `intercepts`).
        interception_dir: Where the interception CA is kept: in ipybox's state, never seen by a sandbox.
        trust_dir: Where the trust bundle kernels use is written: a directory they may read, not write.
    """

    working_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    resolve_placeholders: bool = False
    prefixed_env: bool = False
    dotenv: Path | None = None
    sandbox: SandboxPolicy | None = None
    mcptools_dir: Path | None = None
    refresh_mcptools: bool = False
    approve_shell: bool = False
    require_shell_escape: bool = False
    reset_cwd: bool = False
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    limits_source: str = "limits"
    secrets: tuple[ResolvedSecret, ...] = ()
    interception_dir: Path | None = None
    trust_dir: Path | None = None

    @property
    def needs_proxy(self) -> bool:
        """Whether sandboxed kernels reach the network through a `DomainProxy` (the policy allows domains,
        or asks about unknown hosts)."""
        return self.sandbox is not None and (
            bool(self.sandbox.network.allowed_domains) or self.sandbox.network.unknown == "ask"
        )

    @property
    def interception_hosts(self) -> list[str]:
        """The hosts the proxy's CA is made for: the restricted `allowedDomains` entries and the secrets'
        hosts (none without a proxy)."""
        if self.sandbox is None or not self.needs_proxy:
            return []
        hosts = [*self.sandbox.network.restricted_hosts(), *(h for s in self.secrets for h in s.hosts)]
        return list(dict.fromkeys(hosts))

    @property
    def intercepts(self) -> bool:
        """Whether the proxy terminates TLS for some hosts (secrets or restricted hosts, and the
        directories for the CA and the trust bundle given)."""
        return (
            self.interception_dir is not None and self.trust_dir is not None and bool(self.interception_hosts)
        )

    def interception(self) -> Interception | None:
        """The CA (loaded from `interception_dir`, or made), the trust bundle written to `trust_dir`, the
        secrets' routes and the kernels' variables; `None` when the setup does not intercept.

        Raises:
            InterceptionError: The CA's directory or files are unsafe (a symlink, another user's), or the
                machine has no CA certificates to build the bundle from.
        """
        if not self.intercepts:
            return None
        assert self.interception_dir is not None and self.trust_dir is not None  # `intercepts`
        ca = InterceptionCA.load_or_create(self.interception_dir, self.interception_hosts)
        bundle = trust_bundle(ca, self.trust_dir / TRUST_BUNDLE_FILE)
        ca_file = write_ca_file(ca, self.trust_dir / TRUST_CA_FILE)
        routes = [
            SecretRoute(
                name=secret.name,
                placeholder=secret.placeholder,
                value=secret.value,
                hosts=secret.hosts,
                headers=secret.headers,
            )
            for secret in self.secrets
        ]
        return Interception(ca, routes, {**secrets_env(self.secrets), **trust_env(bundle, ca_file)})

    def kernel_env(
        self,
        tool_address: str,
        tool_token: str | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        interception: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """The environment every kernel gets (a per-kernel call token is added by whoever starts it).

        Args:
            tool_address: The tool server's call address (`ToolServer.calls_address`).
            tool_token: A call token for all kernels; `None` when each kernel gets its own.
            environ: The host's environment (default: `os.environ`).
            interception: The variables of the proxy's interception (`Interception.env`), set over the
                configured ones.

        Raises:
            ValueError: A `${VAR}` placeholder names a variable that is not set.
        """
        host = os.environ if environ is None else environ
        env: dict[str, str] = {}
        if self.prefixed_env:
            env.update(_prefixed_env(self.dotenv, host))
        if self.resolve_placeholders:
            env.update(_resolve_placeholders(self.env, environ=host, dotenv_path=self.dotenv))
        else:
            env.update(self.env)
        # After the configured variables: a `KERNEL_ENV_X` of .env can't replace a placeholder by something
        # else, nor point `SSL_CERT_FILE` away from the bundle that trusts the interception CA.
        env.update(interception or {})
        if self.refresh_mcptools and self.mcptools_dir is not None:
            env[MCPTOOLS_DIR_ENV] = str(self.mcptools_dir)
        # Set by the host alone (after `env`), so no configured variable can turn approval off.
        env.pop(SHELL_APPROVAL_ENV, None)
        env.pop(CWD_RESET_ENV, None)
        if self.approve_shell:
            env[SHELL_APPROVAL_ENV] = "escape" if self.require_shell_escape else "ask"
        if self.reset_cwd:
            env[CWD_RESET_ENV] = str(self.working_dir)
        env[SERVER_ENV] = tool_address
        if tool_token is not None:
            env[TOKEN_ENV] = tool_token
        else:  # only ever the one its starter gives each kernel
            env.pop(TOKEN_ENV, None)
        return env

    def kernel_spec(self, tool_address: str, proxy_socket: Path | None = None) -> KernelSpec | None:
        """The kernelspec kernels are launched with: sandboxed by `sandbox`, or `None` for the default one.

        Raises:
            SandboxUnavailableError: The machine can't sandbox.
            ValueError: Sandboxed, but the tool server does not listen on a Unix socket (a sandboxed kernel
                has no network), or the policy allows domains and no `proxy_socket` is given.
        """
        if self.sandbox is None:
            return None
        if not tool_address.startswith("unix:"):
            raise ValueError(
                f"sandboxed kernels reach the tool server over a Unix socket only, not {tool_address!r}: "
                "start the tool server without a port"
            )
        return sandboxed_kernel_spec(
            self.sandbox,
            self.working_dir,
            tool_socket=Path(tool_address.removeprefix("unix:")),
            proxy_socket=proxy_socket,
            # Under the private /tmp (the supervisor's run directory): made visible, read-only.
            readable=[self.trust_dir] if self.intercepts and self.trust_dir is not None else [],
            tmp_size=self.limits.tmp,
        )

    def prepare_dirs(self) -> None:
        """Make what must exist before a sandboxed kernel starts.

        A sandbox shows the working dir's top level as it was when its kernel started: a package directory
        made later would stay out of its sight until a reset, so `mcptools_dir` is made now.
        """
        if self.sandbox is not None and self.mcptools_dir is not None:
            self.mcptools_dir.mkdir(parents=True, exist_ok=True)
            # Agents write output parsers from kernels, and a sandboxed one can't make a top-level entry.
            with contextlib.suppress(OSError):
                parsers_dir(self.mcptools_dir).mkdir(exist_ok=True)
            # Saved code actions are written by the host (`save_code_action`) after kernels started: the
            # directory must exist before, or `import gentools...` fails in sandboxes started earlier.
            with contextlib.suppress(OSError):
                gentools_dir(self.mcptools_dir).mkdir(exist_ok=True)


def embedded_kernel_setup(
    working_dir: Path,
    kernel_env: Mapping[str, str],
    *,
    sandbox: SandboxPolicy | None,
    mcptools_dir: Path,
    approve_shell: bool = False,
    require_shell_escape: bool = False,
    reset_cwd: bool = False,
    limits: ResourceLimits | None = None,
) -> KernelSetup:
    """What `CodeExecutor`'s embedded gateway starts kernels with.

    `kernel_env` is taken literally: no `${VAR}` placeholders, no `KERNEL_ENV_*` from `.env` or the host.
    The SDK's caller already holds the host's environment and passes what it means to; a kernel of the
    embedded executor gets nothing of the host that its caller did not name (docs/sdk.md, "Kernel
    environment").
    """
    return KernelSetup(
        working_dir=working_dir,
        env=dict(kernel_env),
        sandbox=sandbox,
        mcptools_dir=mcptools_dir,
        approve_shell=approve_shell,
        require_shell_escape=require_shell_escape,
        reset_cwd=reset_cwd,
        limits=limits or ResourceLimits(),
    )


def workspace_kernel_setup(
    config: WorkspaceConfig,
    workspace: Path,
    state_dir: Path,
    *,
    secrets: Mapping[str, ResolvedSecret] | None = None,
    trust_dir: Path | None = None,
) -> KernelSetup:
    """What `ipybox up` starts a workspace's kernels with: `[kernel] env` with `${VAR}` placeholders filled,
    `KERNEL_ENV_*` of the workspace's `.env` and the environment (docs/mcp-server.md), fresh tool
    packages, `[sandbox]` with ipybox's own state directory hidden and what the host executes from the
    workspace read-only (its servers' code, ipybox's own environment: `ipybox.config.executables`), and
    shell-command approval as `[kernel] approve_shell`/`require_shell_escape` say (decided by the
    workspace's rules).

    With `trust_dir` (a directory kernels may read, not write: the supervisor's run directory), sandboxed
    kernels get `secrets` (`[secrets]` resolved on the host) through the proxy, whose interception CA is
    kept in `state_dir` (see the module's description); without it nothing is intercepted.
    """
    policy = None
    if config.sandbox.enabled:
        policy = protect(_hide(config.sandbox.policy(), state_dir), workspace_executables(config, workspace))
    return KernelSetup(
        working_dir=workspace,
        env=dict(config.kernel.env),
        resolve_placeholders=True,
        prefixed_env=True,
        dotenv=workspace / ".env",
        sandbox=policy,
        mcptools_dir=config.resolve(config.workspace.mcptools_dir),
        refresh_mcptools=True,
        approve_shell=config.kernel.approve_shell,
        require_shell_escape=config.kernel.require_shell_escape,
        limits=_workspace_limits(config),
        limits_source="[kernel.limits]",
        secrets=tuple((secrets or {}).values()) if policy is not None else (),
        interception_dir=state_dir / INTERCEPTION_DIR
        if policy is not None and trust_dir is not None
        else None,
        trust_dir=trust_dir if policy is not None else None,
    )


def _workspace_limits(config: WorkspaceConfig) -> ResourceLimits:
    limits = config.kernel.limits
    # The default /tmp size is for sandboxed kernels' private /tmp: unsandboxed ones have none (an explicit
    # `tmp` without the sandbox is a config error, reported at its line).
    if not config.sandbox.enabled and "tmp" not in limits.model_fields_set:
        return limits.without_tmp()
    return limits


def _hide(policy: SandboxPolicy, path: Path) -> SandboxPolicy:
    # Kernels never need ipybox's own state (tokens, logs, the audit log): hide it, not just protect it.
    files = policy.filesystem.model_copy(
        update={
            "deny_read": [*policy.filesystem.deny_read, str(path)],
            "deny_write": [*policy.filesystem.deny_write, str(path)],
        }
    )
    return policy.model_copy(update={"filesystem": files})


@dataclass(frozen=True)
class Interception:
    """What the proxy intercepts with (`KernelSetup.interception()`).

    Attributes:
        ca: The workspace's interception CA.
        routes: The secrets, with their values, for the proxy alone.
        env: What kernels get: each secret's placeholder in its variable, and the trust variables.
    """

    ca: InterceptionCA
    routes: list[SecretRoute]
    env: dict[str, str]


@dataclass
class StartedKernels:
    """A started kernel gateway and, when the sandbox allows domains, its proxy. `stop()` ends both."""

    gateway: KernelGateway
    proxy: DomainProxy | None = None

    async def stop(self) -> None:
        """Stop the gateway (and all its kernels), then the proxy. Raises what the gateway's stop raises,
        after the proxy is stopped too."""
        try:
            await self.gateway.stop()
        finally:
            if self.proxy is not None:
                await self.proxy.stop()


async def start_kernel_gateway(
    setup: KernelSetup,
    tool_address: str,
    *,
    tool_token: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    unix_socket: Path | None = None,
    token: str | None = None,
    request_env: Sequence[str] = (),
    proxy_socket: Path | None = None,
    ask_host: HostAsker | None = None,
    log_level: str = "WARNING",
) -> StartedKernels:
    """Start a kernel gateway whose kernels get `setup`.

    Args:
        setup: What the kernels get.
        tool_address: The tool server's call address (`ToolServer.calls_address`).
        tool_token: A call token for all kernels; `None` when each kernel gets its own (`request_env`).
        host, port, unix_socket, token, request_env, log_level: As for `KernelGateway`.
        proxy_socket: Where the `DomainProxy` listens (default: in a private directory).
        ask_host: Who the proxy asks about unknown hosts when the policy says `unknown = "ask"` (without
            one, such connections are refused, saying nobody can be asked).

    Raises:
        SandboxUnavailableError: The setup is sandboxed and the machine can't sandbox.
        LimitUnavailableError: The setup's limits ask for one this machine can't enforce.
        InterceptionError: The interception CA or the trust bundle can't be made (see `interception`).
        ValueError: A `${VAR}` placeholder names a variable that is not set, or see `kernel_spec`.
    """
    # Everything that can fail on the caller's input fails before any process starts.
    interception = setup.interception()
    env = setup.kernel_env(
        tool_address, tool_token, interception=interception.env if interception is not None else None
    )
    proxy = (
        DomainProxy(
            setup.sandbox.network.allowed_domains,
            setup.sandbox.network.denied_domains,
            read_only=setup.sandbox.network.read_only,
            unknown=setup.sandbox.network.unknown,
            ask=ask_host,
            secrets=interception.routes if interception is not None else (),
            ca=interception.ca if interception is not None else None,
        )
        if (setup.sandbox is not None and setup.needs_proxy)
        else None
    )
    try:
        if proxy is not None:
            proxy_socket = await proxy.start(proxy_socket)
        setup.prepare_dirs()
        spec = setup.kernel_spec(tool_address, proxy_socket if proxy is not None else None)
        gateway = KernelGateway(
            host=host,
            port=port,
            unix_socket=unix_socket,
            env=env,
            working_dir=setup.working_dir,
            kernel_spec=spec,
            log_level=log_level,
            request_env=request_env,
            token=token,
            limits=setup.limits,
            limits_source=setup.limits_source,
        )
        await gateway.start()
    except BaseException:
        if proxy is not None:
            await proxy.stop()
        raise
    return StartedKernels(gateway, proxy)


def _prefixed_env(dotenv: Path | None, environ: Mapping[str, str]) -> dict[str, str]:
    """`KERNEL_ENV_X` from `.env` and the environment (which wins), as `X`; empty values are left out."""
    values: dict[str, str] = {}
    if dotenv is not None and dotenv.is_file():
        values.update((k, v) for k, v in dotenv_values(dotenv).items() if v is not None)
    values.update(environ)
    return {
        k[len(KERNEL_ENV_PREFIX) :]: v for k, v in values.items() if k.startswith(KERNEL_ENV_PREFIX) and v
    }
