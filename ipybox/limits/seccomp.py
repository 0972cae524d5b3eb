"""The seccomp filter that keeps a kernel under `setrlimit` from holding memory no rlimit counts.

RLIMIT_AS counts what a process maps. Memory that outlives its mapping is not counted: a `memfd_create`
file written to with `write()` (issue 31; measured here: 4 GiB held under a 1 GiB limit, as much as was
asked), a `memfd_secret` file, a System V shared memory segment (`shmget`, kept after `shmdt`). The
filter makes those system calls fail with `EPERM`. What else holds memory is a file in a tmpfs: a sandboxed kernel's `/tmp` and
`/dev/shm` are sized by `tmp`, `/dev` is read-only then; an unsandboxed kernel shares the host's, which is
why `setrlimit` refuses a memory limit for one (`Enforcement.unenforceable`).

The filter is compiled by the system's libseccomp (`libseccomp.so.2`, a ctypes binding of the five calls
needed; no BPF is assembled here), for the native architecture: a system call of another one (32-bit
`int 0x80` on x86-64) kills the process, libseccomp's default for a foreign architecture. bubblewrap
installs it (`--add-seccomp-fd`, after `PR_SET_NO_NEW_PRIVS`) right before it executes the sandbox's
command: in force from the kernel's first instruction, inherited by everything it starts, and never
removable. The compiled program lives in a sealed memfd of the process that builds command lines (the
gateway, the tool server), which the limits wrapper opens through `/proc/<pid>/fd/<n>`: nothing on disk,
nothing a kernel could reach or change, gone with the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import functools
import os
import sys

from ipybox.errors import IpyboxError

SHARED_MEMORY_SYSCALLS = ("memfd_create", "memfd_secret", "shmget")
"""Refused with EPERM. `memfd_secret` only where libseccomp knows it (a kernel that has it also needs
`secretmem.enable`); the others are required."""
_OPTIONAL = frozenset({"memfd_secret"})

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_ACT_ERRNO = 0x00050000
_NR_SCMP_ERROR = -1


class SeccompUnavailableError(IpyboxError, OSError):
    """The filter can't be built here (no libseccomp, or one that does not know a system call)."""


@functools.cache
def _libseccomp() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise SeccompUnavailableError(
            errno.ENOENT,
            "libseccomp is not installed (Debian/Ubuntu: apt-get install libseccomp2; Fedora: dnf install "
            "libseccomp)",
        ) from None
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    # The array form: `seccomp_rule_add` is variadic, which ctypes can't call portably.
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_void_p,
    ]
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_export_bpf.restype = ctypes.c_int
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.restype = None
    return lib


@functools.cache  # the same program every time (an error is not cached: it is raised again)
def compile_filter() -> bytes:
    """The filter as a BPF program (`struct sock_filter`s), what `--add-seccomp-fd` reads (measured:
    88 bytes, 1.7 ms to build the first time).

    Raises:
        SeccompUnavailableError: Saying why, and what to install.
    """
    if not sys.platform.startswith("linux"):
        raise SeccompUnavailableError(errno.ENOSYS, f"{sys.platform} has no seccomp")
    lib = _libseccomp()
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailableError(errno.ENOMEM, "libseccomp could not make a filter")
    try:
        for name in SHARED_MEMORY_SYSCALLS:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number == _NR_SCMP_ERROR:
                if name in _OPTIONAL:
                    continue
                raise SeccompUnavailableError(
                    errno.ENOSYS, f"this libseccomp does not know {name}: install a newer libseccomp"
                )
            result = lib.seccomp_rule_add_array(ctx, _SCMP_ACT_ERRNO | errno.EPERM, number, 0, None)
            if result < 0:
                raise SeccompUnavailableError(-result, f"libseccomp refused a rule for {name}")
        read, write = os.pipe()  # the program is a few hundred bytes: it fits a pipe's buffer
        try:
            result = lib.seccomp_export_bpf(ctx, write)
            os.close(write)
            write = -1
            if result < 0:
                raise SeccompUnavailableError(-result, "libseccomp could not export the filter")
            program = b""
            while chunk := os.read(read, 65536):
                program += chunk
        finally:
            os.close(read)
            if write >= 0:
                os.close(write)
    finally:
        lib.seccomp_release(ctx)
    return program


_held: tuple[int, int] | None = None  # (pid, fd): a forked child has its own pid, and builds its own


def filter_path() -> str:
    """A path that opens the compiled filter, valid while this process lives: `/proc/<pid>/fd/<n>` of a
    sealed memfd (read-only to anyone who opens it; close-on-exec, so no child inherits it).

    Raises:
        SeccompUnavailableError: The filter can't be built here.
    """
    global _held
    pid = os.getpid()
    if _held is None or _held[0] != pid:
        program = compile_filter()
        fd = os.memfd_create("ipybox-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.write(fd, program)
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        _held = (pid, fd)
    return f"/proc/{_held[0]}/fd/{_held[1]}"


def seccomp_unavailable() -> str | None:
    """Why the filter can't be built here, or `None` when it can."""
    try:
        compile_filter()
    except SeccompUnavailableError as e:
        return e.strerror
    return None
