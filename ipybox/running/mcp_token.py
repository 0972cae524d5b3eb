"""The bearer token of the workspace's HTTP MCP endpoint, kept across restarts.

Contract: the token is the file `mcp_token` in the workspace's state directory (`.ipybox/` by default):
one line, mode 0600, in a directory of mode 0700 that the sandbox hides from kernels and sandboxed servers
(as it hides `state.json`), so no kernel can read or replace it. `load_or_create` returns the token there,
making one (32 random bytes, URL-safe) the first time; `ipybox up` serves it, and `ipybox connect` prints
it, so a client configuration written once keeps working across `ipybox down`/`up` (with a pinned
`[endpoints] port`). `rotate` replaces it with a new one (`ipybox token rotate`); a running supervisor is
told through its control endpoint and refuses the old token from then on.

Reads and writes hold an exclusive `flock` on the state directory itself, so an `ipybox up` and an
`ipybox connect` that both find no token agree on one. The file is replaced atomically (a new file
renamed over it) and opened without following a symlink (`ipybox.running.state`). A file that does not
hold a token (empty, or not one printable line) is replaced by a new token, and the log says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
from collections.abc import Iterator

from ipybox.running.state import StatePaths, open_state_dir, open_state_file, prepare_state_dir
from ipybox.safefs import replace_file

logger = logging.getLogger(__name__)

TOKEN_FILE = "mcp_token"
"""The token's file in the state directory."""

# What a token of the file may be: printable ASCII without spaces (it goes into an HTTP header), 16 to
# 512 characters (ipybox writes 43; one a person chose is kept if it is no shorter than 16).
_TOKEN = re.compile(r"[!-~]{16,512}")


def new_token() -> str:
    """A new random token (32 bytes, URL-safe base64)."""
    return secrets.token_urlsafe(32)


def load_or_create(paths: StatePaths) -> str:
    """The workspace's MCP token, made (and saved) the first time.

    Raises:
        StateDirError: The state directory, or the file, is not what ipybox makes there.
    """
    with _locked(paths) as dir_fd:
        token = _read(paths)
        if token is None:
            token = new_token()
            replace_file(dir_fd, TOKEN_FILE, token + "\n")
        return token


def rotate(paths: StatePaths) -> str:
    """Replace the workspace's MCP token with a new one, and return it."""
    with _locked(paths) as dir_fd:
        token = new_token()
        replace_file(dir_fd, TOKEN_FILE, token + "\n")
        return token


def _read(paths: StatePaths) -> str | None:
    try:
        fd = open_state_file(paths, TOKEN_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as file:
        text = file.read(1024).decode("ascii", errors="replace").strip()
    if _TOKEN.fullmatch(text) is None:
        logger.warning(
            "%s holds no token (one printable line): a new token replaces it", paths.dir / TOKEN_FILE
        )
        return None
    return text


@contextlib.contextmanager
def _locked(paths: StatePaths) -> Iterator[int]:
    prepare_state_dir(paths)
    dir_fd = open_state_dir(paths)
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX)
        yield dir_fd
    finally:
        os.close(dir_fd)  # releases the lock
