"""Where a [KernelGateway][ipybox.kernel_mgr.server.KernelGateway] publishes its auth token for the
[KernelClient][ipybox.kernel_mgr.client.KernelClient]s of the same user.

ipybox 0.9's gateway had no authentication: its clients know only a host and a port. ipybox's gateway
always requires a random token (any local user could otherwise run code as this one on a loopback port), so
the 0.9-style client has to learn it without being handed it. The gateway writes it to

    <user state dir>/gateways/<host>-<port>.json      e.g. ~/.local/state/ipybox/gateways/127.0.0.1-8888.json

(the user state dir is `$XDG_STATE_HOME/ipybox`, default `~/.local/state/ipybox`; see
[user_state_dir][ipybox.paths.user_state_dir]). The directory is the user's own, mode 0700 (made so, or
refused when it is a symlink or another user's); the file is mode 0600, written atomically (a reader sees
the old file or the new one, never half of one), holds `{"url", "token", "pid"}` and is removed when the
gateway stops. Only the same user can read it, which is exactly who may use the gateway.

Keyed by host and port as a client names them: `localhost` is `127.0.0.1` (where the gateway binds for
it), `[::1]` is `::1`. A client finds no file for a gateway someone else runs (a Jupyter Kernel Gateway of
their own, ipybox 0.9's), and sends no token; nor for a file left by a gateway that was killed (its `pid`
is gone), or one that is not the user's alone (ignored with a warning).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ipybox import process
from ipybox.errors import UnsafePathError
from ipybox.paths import user_state_dir
from ipybox.safefs import open_own_dir, replace_file

logger = logging.getLogger(__name__)


class UnsafeTokenDirError(UnsafePathError, PermissionError):
    """The token directory is a symlink, not a directory, or another user's: nothing is written there."""


def token_dir() -> Path:
    """The directory of published gateway tokens: `<user state dir>/gateways`."""
    return user_state_dir() / "gateways"


def normalize_host(host: str) -> str:
    """The address a gateway binds for `host`: `localhost` is `127.0.0.1`, `[::1]` is `::1`."""
    host = host.strip().removeprefix("[").removesuffix("]")
    return "127.0.0.1" if host == "localhost" else host


def token_path(host: str, port: int, directory: Path | None = None) -> Path:
    """The token file of the gateway at `host:port` (`:` of an IPv6 address written as `_`)."""
    name = f"{normalize_host(host)}-{port}.json".replace(":", "_").replace("/", "_")
    return (directory or token_dir()) / name


@dataclass(frozen=True)
class PublishedToken:
    url: str
    token: str
    pid: int


def publish(host: str, port: int, url: str, token: str, pid: int, directory: Path | None = None) -> Path:
    """Write the token of the gateway at `host:port` (0600, atomically) and return the file's path.

    Raises:
        UnsafeTokenDirError: The directory is a symlink, not a directory, or another user's.
    """
    path = token_path(host, port, directory)
    fd = _open_dir(path.parent)
    try:
        replace_file(fd, path.name, json.dumps({"url": url, "token": token, "pid": pid}), mode=0o600)
    finally:
        os.close(fd)
    return path


def remove(host: str, port: int, token: str, directory: Path | None = None) -> None:
    """Remove the token file of `host:port` if it still holds `token` (never another gateway's)."""
    path = token_path(host, port, directory)
    found = read(host, port, directory, check_pid=False)
    if found is not None and found.token == token:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def read(
    host: str, port: int, directory: Path | None = None, *, check_pid: bool = True
) -> PublishedToken | None:
    """The token published for `host:port`, or `None`: no file, a file of a gateway that is gone
    (`check_pid`), or one that is not a regular file of this user's alone (with a warning)."""
    path = token_path(host, port, directory)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            logger.warning("ignoring the gateway token file %s: it is a symlink", path)
            return None
        raise
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid != os.geteuid()
            or stat.S_IMODE(info.st_mode) & 0o077
        ):
            logger.warning("ignoring the gateway token file %s: not a file of this user's alone", path)
            return None
        content = file.read()
    try:
        data = json.loads(content)
        found = PublishedToken(str(data["url"]), str(data["token"]), int(data["pid"]))
    except (ValueError, KeyError, TypeError):
        logger.warning("ignoring the gateway token file %s: not what a gateway writes", path)
        return None
    if check_pid and not process.is_alive(found.pid):
        logger.debug("ignoring the gateway token file %s: its gateway (pid %d) is gone", path, found.pid)
        return None
    return found


def _open_dir(directory: Path) -> int:
    """A descriptor of `directory` (created 0700 with its parents), opened without following a symlink,
    checked to be this user's and tightened to 0700."""
    return open_own_dir(
        directory,
        create=True,
        unsafe=UnsafeTokenDirError,
        name="the gateway token directory",
        forbidden_mode=0o077,
    )
