"""What code execution returns: results, output chunks and errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ipybox.errors import KernelError

StreamName = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class CodeExecutionChunk:
    """A piece of output, yielded while code runs (`stream(..., chunks=True)`).

    Attributes:
        text: The output text.
        stream: Which stream it was written to: `stdout` (also used for displayed results) or `stderr`.
    """

    text: str
    stream: StreamName = "stdout"


@dataclass(frozen=True)
class CodeExecutionResult:
    """The result of a successful execution.

    Attributes:
        text: All output in the order it was produced (stdout, stderr and displayed results), or `None` when
            there was none. When the output exceeded the executor's limit, this holds its head and tail around
            a notice naming its full size and `output_file`.
        images: Files of the images (PNG, SVG) the code displayed.
        stdout: What was written to stdout (and displayed results), bounded like `text`.
        stderr: What was written to stderr, bounded like `text`.
        output_file: The file holding the complete output, when `text` had to be truncated.
        cancelled: The execution was stopped by `cancel()`. `CodeExecutor.execute()` then returns the
            output up to the cancel with this set (ipybox 0.9.2 returns `text=None`), while
            `CodeExecutor.stream()` ends without a result, as 0.9.2's; `KernelClient.stream()` ends with one
            holding the output up to the cancel.
    """

    text: str | None
    images: list[Path] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    output_file: Path | None = None
    cancelled: bool = False

    @property
    def truncated(self) -> bool:
        """Whether `text` is shortened (the whole output is in `output_file`)."""
        return self.output_file is not None


class CodeExecutionError(KernelError):
    """Raised when executed code fails, or when the kernel dies while running it.

    `str(error)` is the kernel's traceback text (without ANSI colour codes).

    Attributes:
        ename: The exception's class name in the kernel (e.g. `ZeroDivisionError`), or `KernelDied`.
        evalue: The exception's message.
        traceback: The traceback text.
        result: The output produced before the error, so nothing is lost.
    """

    def __init__(
        self,
        message: str,
        *,
        ename: str = "",
        evalue: str = "",
        result: CodeExecutionResult | None = None,
    ) -> None:
        super().__init__(message)
        self.ename = ename
        self.evalue = evalue
        self.traceback = message
        self.result = result


class KernelDiedError(CodeExecutionError):
    """The kernel process died while running the code (e.g. `os._exit`, a segfault, out of memory).

    Its state is lost; the executor has already replaced it with a fresh kernel.
    """


class ResourceLimitError(CodeExecutionError):
    """The code went over one of its kernel's resource limits (its memory limit): the message names the
    limit and the peak, and whether the kernel kept its state.

    Where the kernel itself had to be killed (a control group's memory limit: the kernel's OOM killer ends
    the largest process), its state is lost and the executor has already replaced it with a fresh kernel,
    on which the next execution runs. Where the allocation failed instead (`setrlimit`'s address-space
    limit: a `MemoryError` in the cell), the kernel keeps its state.

    Attributes:
        limit: Which limit (`memory`).
        value: The limit (bytes).
        peak: The most the kernel used (bytes), when known.
        kernel_restarted: Whether the kernel was killed and replaced (its state is lost).
    """

    def __init__(
        self,
        message: str,
        *,
        limit: str,
        value: float,
        peak: int | None = None,
        kernel_restarted: bool,
        ename: str = "ResourceLimitError",
        evalue: str = "",
        result: CodeExecutionResult | None = None,
    ) -> None:
        super().__init__(message, ename=ename, evalue=evalue, result=result)
        self.limit = limit
        self.value = value
        self.peak = peak
        self.kernel_restarted = kernel_restarted
