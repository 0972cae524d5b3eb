"""Why a write failed, said where the agent reads it: in the traceback of a sandboxed kernel.

In a sandbox the working dir's top level stays as it was when the kernel started (see
[view][ipybox.sandbox.view]): `open("report.csv", "w")` there fails with `OSError: [Errno 30]
Read-only file system`, which says nothing about what to do instead. For such an error (EROFS, or EBUSY
for renaming or removing a top-level entry) on a path directly in the working dir, this extension adds a
note to the exception that says why and what works; any other error is shown as it is.

Runs inside kernels: standard library only. `kernel_main` loads it when `IPYBOX_SANDBOX_WORKSPACE` is set
(the sandbox sets it).
"""

from __future__ import annotations

import errno
import os
from types import TracebackType
from typing import Any

SANDBOX_WORKSPACE_ENV = "IPYBOX_SANDBOX_WORKSPACE"
EXTENSION = "ipybox.in_kernel.sandbox_hint"
NOTE = (
    "ipybox sandbox: the top level of the working dir ({workspace}) stays as it was when the kernel "
    "started (the host's own files, such as ipybox.toml, .env and .git, live there): no name can be "
    "added, removed or renamed there, and protected names are read-only. Existing files can be changed "
    "in place; write new files into a subdirectory, e.g. out/."
)


def note_for(error: BaseException, workspace: str) -> str | None:
    """The note for `error`, or None when it is not about the working dir's fixed top level."""
    if not isinstance(error, OSError) or error.errno not in (errno.EROFS, errno.EBUSY, errno.EACCES):
        return None
    for name in (error.filename, error.filename2):
        if isinstance(name, str) and os.path.dirname(os.path.abspath(name)) == workspace:
            return NOTE.format(workspace=workspace)
    return None


def load_ipython_extension(ip: Any) -> None:
    workspace = os.environ.get(SANDBOX_WORKSPACE_ENV)
    if not workspace:
        return

    def explain(
        shell: Any,
        etype: type[BaseException],
        value: BaseException,
        tb: TracebackType | None,
        tb_offset: int | None = None,
    ) -> None:
        note = note_for(value, workspace)
        if note is not None and note not in getattr(value, "__notes__", ()):
            value.add_note(note)
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)

    ip.set_custom_exc((OSError,), explain)
