"""Each cell starts in the kernel's working directory (IPython extension), as ipybox 0.9.2's `working_dir`.

`kernel_main` loads it when `CWD_RESET_ENV` names a directory (`CodeExecutor` sets it only when the caller
passed `working_dir`, as 0.9.2 did); a client that did not start the kernel calls
[install][ipybox.in_kernel.working_dir.install] from its init code instead.

After every cell (IPython's `post_run_cell`, which runs whether the cell failed or not), if the current
directory is not the working directory (the cell called `os.chdir` or `%cd`, or removed the directory it was
in), the kernel changes back and prints `[ipybox] cwd reset to <dir>` (0.9.2's wording) as the last output
of that cell, so the agent knows its `cd` did not persist. Directories are compared resolved (symlinks,
`..`), so a working dir given through a symlink is not "reset" after every cell.

Runs inside kernels: standard library only.
"""

from __future__ import annotations

import os
from typing import Any

CWD_RESET_ENV = "IPYBOX_CWD_RESET"
"""The directory each cell starts in (ipybox 0.9.2's `working_dir`)."""

EXTENSION = "ipybox.in_kernel.working_dir"

NOTICE = "[ipybox] cwd reset to {directory}"

_HOOK = "_ipybox_cwd_reset"


def install(ip: Any, directory: str) -> None:
    """Change to `directory` now and back to it after every cell of `ip` (an IPython shell) that left it.

    Installing again replaces the directory (one hook per shell).

    Raises:
        OSError: `directory` cannot be changed to (it does not exist, is not a directory, ...).
    """
    os.chdir(directory)
    previous = getattr(ip, _HOOK, None)
    if previous is not None:
        ip.events.unregister("post_run_cell", previous)
    resolved = os.path.realpath(directory)

    def restore_cwd(result: Any = None) -> None:
        try:
            current: str | None = os.getcwd()
        except FileNotFoundError:  # the cell removed the directory it was in
            current = None
        if current == resolved:
            return
        try:
            os.chdir(directory)
        except OSError as e:
            print(f"[ipybox] cannot reset cwd to {directory}: {e}")
            return
        print(NOTICE.format(directory=directory))

    ip.events.register("post_run_cell", restore_cwd)
    setattr(ip, _HOOK, restore_cwd)


def load_ipython_extension(ip: Any) -> None:
    directory = os.environ.get(CWD_RESET_ENV)
    if directory:
        install(ip, directory)
