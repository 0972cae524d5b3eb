"""`SandboxedKernelLaunch`: how to start a kernel inside the sandbox, in no kernel manager's format.

The sandbox wraps a kernel command line it is given; it does not know which kernel that is, how the host
starts kernels or where the host keeps its files. Whoever starts kernels (ipybox's gateway, through
[kernelspec][ipybox.kernels.kernelspec]) turns this description into its own format.

Contract: `argv` follows Jupyter's kernelspec conventions, which every kernel manager fills in when it
starts a kernel: `{connection_file}` is the kernel's connection file and `{resource_dir}` the directory
the `resources` were written to. Any placeholder of the caller's own (e.g. for a directory known only
later) is passed through unchanged, and must be filled in before the kernel starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

InterruptMode = Literal["signal", "message"]
"""`signal`: SIGINT to the started process reaches the kernel. `message`: it would not (the sandbox forks
the kernel), so interrupt with a request on the kernel's control channel."""


@dataclass(frozen=True)
class SandboxedKernelLaunch:
    """A sandboxed kernel's command line, how to interrupt it, and the files the command line reads.

    Attributes:
        argv: The command line: the sandbox, wrapping the kernel's own command line.
        interrupt_mode: How the kernel can be interrupted (see `InterruptMode`).
        resources: Files (name -> content) to write to one directory before a kernel starts; `argv`
            names that directory `{resource_dir}`. They say how the kernel is confined: write them where
            no sandboxed process can write.
    """

    argv: tuple[str, ...]
    interrupt_mode: InterruptMode
    resources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
