"""Setting up ipybox's in-kernel part in a kernel the host did not start: one of a remote gateway (Jupyter
Enterprise Gateway), which shares no files with the host and reaches it only over the network.

The host runs one silent execution in the kernel right after it answers:

```python
import ipybox.in_kernel.remote as _r; _r.install('{"protocol": 1, "server": "tls://host:port", ...}')
```

`install(config_json)` takes one JSON object:

- `protocol` (int): the version of this contract and of the call channel's ops the host speaks; it must be
  `PROTOCOL`, else `ProtocolMismatchError` says which ipybox to install in the kernel image (`ipybox`, the
  host's version, optional, names it).
- `server`, `token`, `cert` (PEM or null): the call channel's address, the kernel's call token and the
  certificate a `tls://` address is pinned to; set as `IPYBOX_TOOL_SERVER`, `IPYBOX_TOOL_TOKEN`,
  `IPYBOX_TOOL_CERT` (after `env`, so nothing in `env` overrides them). The token is never in the kernel's
  start request, which the gateway may log.
- `roots` (object): the host paths of the generated packages, by top-level name (`mcptools`, `gentools`,
  `mcpparse`): those names are imported from the tool server (`ipybox.in_kernel.remote_modules`), whose
  modules are dropped before a cell after the host's files changed.
- `extensions` (object): `shell_approval` (false, true, `"ask"` or `"escape"`: shell commands ask the
  tool server first, `ipybox.in_kernel.shell_approval`; true takes the mode from `env`'s
  `IPYBOX_SHELL_APPROVAL`, else `ask`) and `cwd` (a directory to change to, when it exists in the kernel).
- `env` (object): environment variables to set. As in a local kernel, `IPYBOX_SHELL_APPROVAL` there also
  loads shell approval, and `IPYBOX_CWD_RESET` the working-dir reset after each cell.

Contract: everything is checked before anything changes; a config that is not this shape raises
`ValueError` naming the field. Shell approval, when asked for, is loaded or `install` raises
(`RuntimeError`, the import hook removed again): the host then deletes the kernel (fail closed). Installing the same config again does
nothing; a different one replaces the first (one import hook, one `pre_run_cell` callback, the packages'
modules dropped, variables only the first `env` set removed).

Runs inside kernels: standard library only (and the running IPython shell).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Final

from ipybox.in_kernel import shell_approval, working_dir
from ipybox.in_kernel.call_protocol import CERT_ENV, SERVER_ENV, TOKEN_ENV
from ipybox.in_kernel.remote_modules import SERVED, RemoteModules

__all__ = ["PROTOCOL", "ProtocolMismatchError", "install", "uninstall"]

PROTOCOL: Final = 1
"""The version of the set-up contract and of the call channel's ops this in-kernel part speaks."""

_ADDRESS_SCHEMES = ("unix:", "tcp://", "tls://")
_KEYS = frozenset({"protocol", "ipybox", "server", "token", "cert", "roots", "extensions", "env"})
_EXTENSIONS = frozenset({"shell_approval", "cwd"})


class ProtocolMismatchError(RuntimeError):
    """The host speaks another protocol than this kernel's ipybox: install the host's ipybox in the image."""


@dataclass(frozen=True)
class _Config:
    server: str
    token: str
    cert: str | None
    names: tuple[str, ...]
    shell_approval: str | None  # the mode, or None
    cwd: str | None
    cwd_reset: str | None
    env: tuple[tuple[str, str], ...]


@dataclass
class _Installed:
    config: _Config
    shell: Any
    finder: RemoteModules


_installed: _Installed | None = None


def install(config_json: str, shell: Any = None) -> None:
    """Set this kernel up from the host's `config_json` (see the module's description).

    Args:
        config_json: The JSON object the host sends.
        shell: The IPython shell (default: the running one).

    Raises:
        ProtocolMismatchError: The host speaks another protocol.
        ValueError: The config is not the shape described.
        RuntimeError: No IPython shell runs here, or shell approval could not be loaded.
    """
    global _installed
    config = _parse(config_json)
    ip = shell if shell is not None else _running_shell()
    if _installed is not None and _installed.config == config and _installed.shell is ip:
        return
    previous = _installed
    if previous is not None:
        uninstall()
        for name in dict(previous.config.env).keys() - dict(config.env).keys():
            os.environ.pop(name, None)
    for name, value in config.env:
        os.environ[name] = value
    os.environ[SERVER_ENV] = config.server
    os.environ[TOKEN_ENV] = config.token
    if config.cert is None:
        os.environ.pop(CERT_ENV, None)
    else:
        os.environ[CERT_ENV] = config.cert
    finder = RemoteModules(config.names, address=config.server, token=config.token)
    sys.meta_path.insert(0, finder)
    ip.events.register("pre_run_cell", finder.check_generation)
    _installed = _Installed(config, ip, finder)
    if config.cwd is not None and os.path.isdir(config.cwd):
        os.chdir(config.cwd)
    if config.cwd_reset is not None and os.path.isdir(config.cwd_reset):
        working_dir.install(ip, config.cwd_reset)
    if config.shell_approval is not None:
        os.environ[shell_approval.SHELL_APPROVAL_ENV] = config.shell_approval
        try:
            # Where to ask is read from the environment when a command asks: a later `install` with
            # another server or token moves the guard along.
            shell_approval.install(ip, config.shell_approval)
        except Exception as e:
            uninstall()  # so that installing again tries again, instead of finding it done
            raise RuntimeError(
                f"shell approval could not be loaded in this kernel ({type(e).__name__}: {e}); a kernel "
                "whose shell commands are to be approved must not run without it"
            ) from e


def uninstall() -> None:
    """Remove the import hook and its `pre_run_cell` callback, and drop the packages' modules (shell
    approval, once loaded, stays: it is never turned off). Nothing happens when nothing is installed."""
    global _installed
    installed, _installed = _installed, None
    if installed is None:
        return
    finder = installed.finder
    while finder in sys.meta_path:
        sys.meta_path.remove(finder)
    with contextlib.suppress(ValueError):  # unregistered by someone else
        installed.shell.events.unregister("pre_run_cell", finder.check_generation)
    finder.forget()


def _running_shell() -> Any:
    get_ipython = getattr(builtins, "get_ipython", None)
    if get_ipython is None and "IPython" in sys.modules:
        get_ipython = getattr(sys.modules["IPython"], "get_ipython", None)
    shell = get_ipython() if get_ipython is not None else None
    if shell is None:
        raise RuntimeError("ipybox.in_kernel.remote.install() runs inside an IPython kernel (none runs here)")
    return shell


def _parse(config_json: str) -> _Config:
    try:
        config = json.loads(config_json)
    except (TypeError, ValueError) as e:
        raise ValueError(f"the ipybox kernel set-up is not JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError("the ipybox kernel set-up must be a JSON object")
    protocol = config.get("protocol")
    if protocol != PROTOCOL:
        host_version = config.get("ipybox")
        wanted = (
            f"ipybox=={host_version}" if isinstance(host_version, str) else "the host's version of ipybox"
        )
        raise ProtocolMismatchError(
            f"this kernel has ipybox {_version()}'s in-kernel part (protocol {PROTOCOL}); the host speaks "
            f"protocol {protocol!r}: install {wanted} in the kernel image"
        )
    unknown = sorted(set(config) - _KEYS)
    if unknown:
        raise ValueError(f"unknown keys in the ipybox kernel set-up: {', '.join(unknown)}")
    server = config.get("server")
    if not isinstance(server, str) or not server.startswith(_ADDRESS_SCHEMES):
        raise ValueError(
            f"'server' must be a call channel address ({', '.join(_ADDRESS_SCHEMES)}), not {server!r}"
        )
    token = config.get("token")
    if not isinstance(token, str) or not token:
        raise ValueError("'token' must be the kernel's call token (a non-empty string)")
    cert = config.get("cert")
    if cert is not None and not isinstance(cert, str):
        raise ValueError("'cert' must be a PEM certificate (a string) or null")
    roots = _mapping(config, "roots")
    names = tuple(sorted(roots))
    if not set(names) <= set(SERVED):
        raise ValueError(
            f"'roots' may name {', '.join(SERVED)} only, not {', '.join(sorted(set(names) - set(SERVED)))}"
        )
    env = _mapping(config, "env")
    extensions = config.get("extensions") or {}
    if not isinstance(extensions, dict) or not set(extensions) <= _EXTENSIONS:
        raise ValueError(f"'extensions' must be an object with the keys {', '.join(sorted(_EXTENSIONS))}")
    cwd = extensions.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError(f"'extensions.cwd' must be a directory (a string) or null, not {cwd!r}")
    return _Config(
        server=server,
        token=token,
        cert=cert,
        names=names,
        shell_approval=_shell_approval_mode(extensions.get("shell_approval"), env),
        cwd=cwd,
        cwd_reset=env.get(working_dir.CWD_RESET_ENV) or None,
        env=tuple(sorted(env.items())),
    )


def _mapping(config: dict[str, Any], key: str) -> dict[str, str]:
    value = config.get(key) or {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"'{key}' must be an object of strings")
    return value


def _shell_approval_mode(given: object, env: dict[str, str]) -> str | None:
    # As in a local kernel, the mode in the kernel's environment loads it too: whichever way the host says
    # so, a kernel whose shell commands are to be approved gets the guard (fail closed).
    # The stricter of the two modes wins.
    modes = {env.get(shell_approval.SHELL_APPROVAL_ENV) or None}
    if given is True:
        modes.add("ask")
    elif isinstance(given, str):
        modes.add(given)
    elif given not in (None, False):
        raise ValueError(f"'extensions.shell_approval' must be true, false, 'ask' or 'escape', not {given!r}")
    modes.discard(None)
    unknown = modes - set(shell_approval.MODES)
    if unknown:
        raise ValueError(
            f"the shell approval mode must be one of {', '.join(shell_approval.MODES)}, not {unknown.pop()!r}"
        )
    return "escape" if "escape" in modes else "ask" if modes else None


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("ipybox")
    except Exception:
        return "(unknown version)"
