"""Collecting a cell's output with bounded memory.

Up to `limit` characters are kept in memory. Past that, the complete output goes to a file and only a head
and a tail stay in memory, so a cell that prints gigabytes costs a file, not RAM, and nothing is lost.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections import deque
from pathlib import Path
from typing import IO

from ipybox.code_exec.result import CodeExecutionResult, StreamName

# CSI sequences (colours, cursor movement) and OSC sequences (titles, hyperlinks).
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """Remove terminal escape sequences."""
    return _ANSI.sub("", text) if "\x1b" in text else text


class BoundedText:
    """Text that keeps its first `limit // 2` and last `limit // 2` characters once it exceeds `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
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
            self._head = whole[: self.limit // 2]
            text = whole[self.limit // 2 :]
        half = self.limit - self.limit // 2
        self._tail.append(text[-half:])
        self._tail_size += min(len(text), half)
        while self._tail and self._tail_size - len(self._tail[0]) >= half:
            self._tail_size -= len(self._tail.popleft())
        return whole

    def render(self, notice: str) -> str:
        if not self._overflowed:
            return "".join(self._parts)
        half = self.limit - self.limit // 2
        tail = "".join(self._tail)[-half:]
        return f"{self._head}\n{notice}\n{tail}"


class OutputCollector:
    """Gathers one execution's output: text streams, displayed results and images.

    Args:
        limit: Characters of output kept in memory before spilling the complete output to a file.
        images_dir: Where displayed images are written (created on first use).
        output_dir: Where the complete output goes once it exceeds `limit` (created on first use).
    """

    def __init__(self, limit: int, images_dir: Path, output_dir: Path) -> None:
        self.images_dir = images_dir
        self.output_dir = output_dir
        self.images: list[Path] = []
        self._text = BoundedText(limit)
        self._streams: dict[StreamName, BoundedText] = {
            "stdout": BoundedText(limit),
            "stderr": BoundedText(limit),
        }
        self._spill: IO[str] | None = None
        self._spill_path: Path | None = None
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
            self._spill.write(text)
        self._last_char = text[-1]
        return text

    def add_result(self, data: dict[str, object]) -> str | None:
        """Record display data or an execution result (a MIME bundle).

        Images are saved as files; otherwise the plain-text form becomes output, on a line of its own.
        Returns the text that was added, if any.
        """
        saved = False
        for mime, suffix in (("image/png", ".png"), ("image/svg+xml", ".svg")):
            payload = data.get(mime)
            if isinstance(payload, str):
                self._save_image(payload, mime, suffix)
                saved = True
        plain = data.get("text/plain")
        if saved or not isinstance(plain, str):
            return None
        text = plain if self._last_char == "\n" else "\n" + plain
        return self.add_text(text + "\n")

    def _save_image(self, payload: str, mime: str, suffix: str) -> None:
        self.images_dir.mkdir(parents=True, exist_ok=True)
        path = self.images_dir / f"{uuid.uuid4().hex[:12]}{suffix}"
        content = payload.encode() if mime == "image/svg+xml" else base64.b64decode(payload)
        path.write_bytes(content)
        self.images.append(path.resolve())

    def _start_spill(self, whole: str) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._spill_path = (self.output_dir / f"output-{uuid.uuid4().hex[:12]}.txt").resolve()
        self._spill = open(self._spill_path, "w", encoding="utf-8")  # noqa: SIM115
        self._spill.write(whole)

    def result(self) -> CodeExecutionResult:
        """The result so far (closing the spill file, if any)."""
        if self._spill is not None:
            self._spill.close()
            self._spill = None
        notice = ""
        if self._spill_path is not None:
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
