"""The seccomp filter of a kernel under `setrlimit`: built by libseccomp, held in a sealed memfd that the
limits wrapper opens by path, which no one can change. (What it refuses, in a real kernel:
test_kernel_limits.)"""

from __future__ import annotations

import os
import sys

import pytest

from ipybox.limits.seccomp import compile_filter, filter_path

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="seccomp is Linux's")


def test_the_filter_is_a_bpf_program_of_whole_instructions() -> None:
    program = compile_filter()

    assert program and len(program) % 8 == 0  # struct sock_filter: 8 bytes each


@pytest.mark.user_dependent  # the unprivileged pass runs it again: see tests/sandbox/test_unprivileged.py
def test_the_filters_path_opens_the_program_and_it_cannot_be_changed_through_it() -> None:
    path = filter_path()
    assert path == filter_path(), "built once per process"

    with open(path, "rb") as f:
        assert f.read() == compile_filter()
    fd = os.open(path, os.O_WRONLY)
    try:
        with pytest.raises(PermissionError):  # F_SEAL_WRITE
            os.write(fd, b"\0" * 8)
        with pytest.raises(PermissionError):  # F_SEAL_SHRINK
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
