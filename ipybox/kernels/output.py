"""Collecting a cell's output with bounded memory.

Up to `limit` characters are kept in memory. Past that, the complete output goes to a file and only a head
and a tail stay in memory, so a cell that prints gigabytes costs a file, not RAM, and nothing is lost.

Where complete outputs live: without an `output_dir` (and for ipybox's old shared default,
`$TMPDIR/ipybox-output`, which any local user could create first and so read or delete what lands in it),
in a private directory of this process, `$TMPDIR/ipybox-output-<random>`, made by `mkdtemp` (mode 0700,
a name no one can guess or claim first) on the first complete output and checked again before every
later one. Files are created new (`O_EXCL`, `O_NOFOLLOW`), mode 0600, named `output-<128 random bits>.txt`,
so nothing is written through a link someone planted. ipybox never deletes them: `output_file` stays
readable after the executor stopped, until the user or the system's temporary-file cleaning removes it.

A given `output_dir` or `images_dir` (which may lie in a working directory a kernel writes in) is created
if missing (the output directory with mode 0700) and written through a descriptor reached without following
a symlink anywhere on its path (`ipybox.safefs.open_dir`): if a kernel replaced it, or a directory above
it, by a symlink, the file goes to the private directory instead, with a warning in the log, and the
symlink is left alone.

What a cell makes the host write is bounded (a kernel that prints forever or displays huge images must
not fill the disk): its complete output file stops at `max_file_bytes` (the file and the result's notice
say so; what was written stays), an image over `max_image_bytes` is not saved, nor one that would take the
cell's images together past `max_file_bytes`; the output says so in its place, naming the setting.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import stat
import tempfile
import threading
import uuid
from collections import deque
from pathlib import Path
from typing import IO

from ipybox.kernels.result import CodeExecutionResult, StreamName
from ipybox.limits import format_bytes
from ipybox.safefs import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_OUTPUT_FILE_BYTES,
    DIR_FLAGS,
    NEW_FILE_FLAGS,
    open_dir,
)

logger = logging.getLogger(__name__)

SHARED_OUTPUT_DIR_NAME = "ipybox-output"
"""ipybox's old default output directory in `$TMPDIR`: shared by all users, so never used any more."""


_private_dirs: dict[str, Path] = {}  # $TMPDIR -> this process's private output directory in it
_private_lock = threading.Lock()

# CSI sequences (colours, cursor movement) and OSC sequences (titles, hyperlinks).
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """Remove terminal escape sequences."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def private_output_dir() -> Path:
    """This process's private directory for complete outputs (see the module's docstring), created on the
    first call, and again if it was removed or is no longer a directory of ours that only we can open."""
    fd, path = _open_private_dir()
    os.close(fd)
    return path


def _open_private_dir() -> tuple[int, Path]:
    base = tempfile.gettempdir()
    with _private_lock:
        path = _private_dirs.get(base)
        fd = _open_dir(path, private=True) if path is not None else None
        if fd is None or path is None:
            path = Path(tempfile.mkdtemp(prefix=f"{SHARED_OUTPUT_DIR_NAME}-", dir=base)).resolve()
            fd = _open_dir(path, private=True)
            if fd is None:
                raise OSError(f"the new private output directory {path} can't be opened as one")
            _private_dirs[base] = path
        return fd, path


def _open_dir(path: Path, *, private: bool = False) -> int | None:
    """A descriptor of the directory `path`, whose last component must be a real directory, not a symlink
    (and with `private`, one of ours that only we can open); `None` if it is not."""
    try:
        fd = os.open(path, DIR_FLAGS)
    except OSError:
        return None
    if private:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            os.close(fd)
            return None
    return fd


def _is_shared_default(path: Path) -> bool:
    return path == Path(tempfile.gettempdir()) / SHARED_OUTPUT_DIR_NAME


class BoundedText:
    """Text that keeps its first `limit // 2` and last `limit // 2` characters once it exceeds `limit`; with
    `tail=False`, its first `limit` characters only (ipybox 0.9.2's MCP server showed the first N)."""

    def __init__(self, limit: int, *, tail: bool = True) -> None:
        self.limit = limit
        self.head_size = limit // 2 if tail else limit
        self.size = 0
        self._parts: list[str] = []
        self._head = ""
        self._tail: deque[str] = deque()
        self._tail_size = 0
        self._overflowed = False

    @property
    def overflowed(self) -> bool:
        return self._overflowed

    def append(self, text: str) -> str | None:
        """Add text. Returns the complete text so far exactly once: when this append overflows the limit."""
        self.size += len(text)
        whole: str | None = None
        if not self._overflowed:
            self._parts.append(text)
            if self.size <= self.limit:
                return None
            whole = "".join(self._parts)
            self._parts = []
            self._overflowed = True
            self._head = whole[: self.head_size]
            text = whole[self.head_size :]
        half = self.limit - self.head_size
        if half == 0:
            return whole
        self._tail.append(text[-half:])
        self._tail_size += min(len(text), half)
        while self._tail and self._tail_size - len(self._tail[0]) >= half:
            self._tail_size -= len(self._tail.popleft())
        return whole

    def render(self, notice: str) -> str:
        if not self._overflowed:
            return "".join(self._parts)
        half = self.limit - self.head_size
        tail = "".join(self._tail)[-half:] if half else ""
        return f"{self._head}\n{notice}\n{tail}"


class OutputCollector:
    """Gathers one execution's output: text streams, displayed results and images.

    Args:
        limit: Characters of output kept in memory before spilling the complete output to a file.
        images_dir: Where displayed images are written (created on first use).
        output_dir: Where the complete output goes once it exceeds `limit` (created on first use, mode
            0700); `None`, or the old shared `$TMPDIR/ipybox-output`, for this process's private directory.
        max_file_bytes: Bytes of the complete output written to its file; and of all images together.
        max_image_bytes: The largest image saved.
        keep_tail: Keep the end of a long output besides its start (`False`: its first `limit` characters).
    """

    def __init__(
        self,
        limit: int,
        images_dir: Path,
        output_dir: Path | None = None,
        *,
        max_file_bytes: int = DEFAULT_MAX_OUTPUT_FILE_BYTES,
        max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
        keep_tail: bool = True,
    ) -> None:
        self.images_dir = images_dir
        self.output_dir = None if output_dir is None or _is_shared_default(output_dir) else output_dir
        self.max_file_bytes = max_file_bytes
        self.max_image_bytes = max_image_bytes
        self.images: list[Path] = []
        self._image_bytes = 0
        self._text = BoundedText(limit, tail=keep_tail)
        self._streams: dict[StreamName, BoundedText] = {
            "stdout": BoundedText(limit, tail=keep_tail),
            "stderr": BoundedText(limit, tail=keep_tail),
        }
        self._spill: IO[bytes] | None = None
        self._spill_path: Path | None = None
        self._spill_bytes = 0
        self._spill_full = False  # stopped at `max_file_bytes`
        self._last_char = "\n"

    def add_text(self, text: str, stream: StreamName = "stdout") -> str:
        """Record text written to a stream; returns it without escape codes."""
        text = strip_ansi(text)
        if not text:
            return text
        whole = self._text.append(text)
        self._streams[stream].append(text)
        if whole is not None:
            self._start_spill(whole)
        elif self._spill is not None:
            self._write_spill(text)
        self._last_char = text[-1]
        return text

    def add_result(self, data: dict[str, object]) -> str | None:
        """Record display data or an execution result (a MIME bundle).

        Images are saved as files; otherwise the plain-text form becomes output, on a line of its own.
        Returns the text that was added, if any.
        """
        saved = False
        refused: list[str] = []
        for mime, suffix in (("image/png", ".png"), ("image/svg+xml", ".svg")):
            payload = data.get(mime)
            if isinstance(payload, str):
                notice = self._save_image(payload, mime, suffix)
                saved = saved or notice is None
                refused += [notice] if notice is not None else []
        plain = data.get("text/plain")
        if refused and not saved:
            plain = "\n".join(refused)
        if saved or not isinstance(plain, str):
            return None
        text = plain if self._last_char == "\n" else "\n" + plain
        return self.add_text(text + "\n")

    def _save_image(self, payload: str, mime: str, suffix: str) -> str | None:
        """Save an image; `None` when saved, else the notice that takes its place in the output."""
        content = payload.encode() if mime == "image/svg+xml" else base64.b64decode(payload)
        size = f"{format_bytes(len(content))} {mime}"
        if len(content) > self.max_image_bytes:
            return (
                f"[ipybox: image not saved: {size} is more than max_image_bytes "
                f"({format_bytes(self.max_image_bytes)})]"
            )
        if self._image_bytes + len(content) > self.max_file_bytes:
            return (
                f"[ipybox: image not saved ({size}): this cell's images together would pass "
                f"max_output_file_bytes ({format_bytes(self.max_file_bytes)})]"
            )
        self._image_bytes += len(content)
        name = f"{uuid.uuid4().hex[:12]}{suffix}"
        fd, path = _create_file(self.images_dir, name, "an image", mode=0o666, dir_mode=0o777)
        with os.fdopen(fd, "wb") as file:
            file.write(content)
        self.images.append(path)
        return None

    def _start_spill(self, whole: str) -> None:
        name = f"output-{uuid.uuid4().hex}.txt"
        fd, self._spill_path = _create_file(
            self.output_dir, name, "the complete output", mode=0o600, dir_mode=0o700
        )
        self._spill = os.fdopen(fd, "wb")
        self._write_spill(whole)

    def _write_spill(self, text: str) -> None:
        """Append to the complete output, up to `max_file_bytes`; past it, end the file with a notice and
        write nothing more (what was written stays)."""
        if self._spill is None:
            return
        try:
            data = text.encode()
        except UnicodeEncodeError:  # a lone surrogate has no UTF-8 form: U+FFFD, as everywhere else
            data = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()
        room = self.max_file_bytes - self._spill_bytes
        if len(data) > room:
            data = data[:room].decode("utf-8", "ignore").encode()  # whole characters only
            self._spill_full = True
        self._spill.write(data)
        self._spill_bytes += len(data)
        if self._spill_full:
            self._spill.write(f"\n{self._file_notice()}\n".encode())
            self._spill.close()
            self._spill = None

    def _file_notice(self) -> str:
        return (
            f"[ipybox: the complete output stops here: it reached max_output_file_bytes "
            f"({format_bytes(self.max_file_bytes)}); the rest was not saved]"
        )

    def result(self) -> CodeExecutionResult:
        """The result so far (closing the spill file, if any)."""
        if self._spill is not None:
            self._spill.close()
            self._spill = None
        notice = ""
        if self._spill_path is not None and self._spill_full:
            notice = (
                f"[ipybox: output truncated: {self._text.size:,} characters in total; only its first "
                f"{format_bytes(self._spill_bytes)} were saved, in {self._spill_path}: the file stops at "
                f"max_output_file_bytes ({format_bytes(self.max_file_bytes)})]"
            )
        elif self._spill_path is not None:
            notice = (
                f"[ipybox: output truncated: {self._text.size:,} characters in total; "
                f"the complete output is in {self._spill_path}]"
            )
        text = self._text.render(notice).rstrip()
        return CodeExecutionResult(
            text=text or None,
            images=list(self.images),
            stdout=self._streams["stdout"].render(notice).rstrip(),
            stderr=self._streams["stderr"].render(notice).rstrip(),
            output_file=self._spill_path,
        )


def _create_file(
    directory: Path | None, name: str, what: str, *, mode: int, dir_mode: int
) -> tuple[int, Path]:
    """Create the new file `name` (with `mode`) in `directory`, created with `dir_mode` if missing; or, mode
    0600, in the private directory when `directory` is `None` or can't be opened as a real directory (a
    symlink a kernel planted, a file). Returns the file's descriptor and path."""
    fd: int | None = None
    if directory is not None:
        try:  # never through a symlink on the way (a kernel may have planted one), see `ipybox.safefs`
            fd = open_dir(directory, create_mode=dir_mode)
        except OSError as e:
            logger.warning(
                "not writing %s to %s (%s): it goes to the private output directory instead",
                what,
                directory,
                e,
            )
            directory = None
    if fd is None or directory is None:
        fd, directory = _open_private_dir()
        mode = 0o600
    try:
        return os.open(name, NEW_FILE_FLAGS, mode, dir_fd=fd), Path(os.path.abspath(directory)) / name
    finally:
        os.close(fd)
