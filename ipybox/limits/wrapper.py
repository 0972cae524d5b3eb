"""The command line that starts a process inside its limits: `limited_argv`.

A process must be in its control group and under its rlimits *before* it starts, and so must everything
it forks from its first instruction on (bubblewrap forks the sandboxed kernel at once): moving it after
`fork` would race those children. So the command runs under a small POSIX shell script that joins the
group (writes its own pid to `cgroup.procs`), sets the rlimits (`ulimit`, soft and hard: the process can't
raise them again, short of CAP_SYS_RESOURCE, which only an unsandboxed kernel running as root has), opens
the seccomp filter bubblewrap is to install on descriptor `SECCOMP_FD` (see [seccomp][ipybox.limits.seccomp])
and `exec`s the command. It costs about 0.5 ms per start; a Python launcher would cost 12 ms (measured on
this machine: `sh -c` 1.1 ms, `python -I -S` 12.5 ms, `/bin/true` 0.6 ms).

Nothing in the script comes from its arguments as code: paths and numbers are passed as positional
arguments, which the script only compares, writes and hands to `ulimit`. A step that fails stops the start
with exit status 125 (the shell's message names the file or limit); the process never runs unlimited.
"""

from __future__ import annotations

from collections.abc import Sequence

SHELL = "/bin/sh"
FAILED_STATUS = 125
SECCOMP_FD = 9
"""The descriptor the filter is opened on (`--add-seccomp-fd 9`); bubblewrap closes it once read."""
SCRIPT = f"""\
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
  case "$1" in
    nofile=*) ulimit -n "${{1#nofile=}}" || exit {FAILED_STATUS} ;;
    nproc=*) ulimit -u "${{1#nproc=}}" 2>/dev/null || ulimit -p "${{1#nproc=}}" || exit {FAILED_STATUS} ;;
    as=*) ulimit -v "${{1#as=}}" || exit {FAILED_STATUS} ;;
    fsize=*) ulimit -f "${{1#fsize=}}" || exit {FAILED_STATUS} ;;
    seccomp=*) command exec {SECCOMP_FD}< "${{1#seccomp=}}" || exit {FAILED_STATUS} ;;
    *) echo "$$" > "$1" || exit {FAILED_STATUS} ;;
  esac
  shift
done
shift
exec "$@"
"""
"""dash (Debian's `/bin/sh`) calls the process limit `-p`, bash `-u` (its `-p` is the pipe size, which it
refuses to set): `-u` first, quietly. `ulimit -f` counts 512-byte blocks (dash, and bash as `sh`).
`command exec`: a failed redirection of plain `exec` ends the shell with its own status, not 125."""


_STEPS = ("nofile=", "nproc=", "as=", "fsize=", "seccomp=")


def limited_argv(
    argv: Sequence[str],
    *,
    join: Sequence[str] = (),
    open_files: int | None = None,
    processes: int | None = None,
    address_space: int | None = None,
    file_size: int | None = None,
    seccomp: str | None = None,
) -> list[str]:
    """`argv`, started in the groups of `join` (their `cgroup.procs` files) and under the rlimits given.

    Args:
        argv: The command.
        join: `cgroup.procs` files to write the process's pid to.
        open_files: RLIMIT_NOFILE.
        processes: RLIMIT_NPROC (of the user: see `ResourceLimits.processes`).
        address_space: RLIMIT_AS, in bytes (rounded down to KiB, `ulimit -v`'s unit).
        file_size: RLIMIT_FSIZE, in bytes (rounded down to 512, `ulimit -f`'s unit).
        seccomp: A file to open on `SECCOMP_FD` (for the command, bubblewrap, to install).

    Returns:
        `argv` itself when there is nothing to do.
    """
    steps: list[str] = []
    if open_files is not None:
        steps.append(f"nofile={int(open_files)}")
    if processes is not None:
        steps.append(f"nproc={int(processes)}")
    if address_space is not None:
        steps.append(f"as={max(1, int(address_space) // 1024)}")
    if file_size is not None:
        steps.append(f"fsize={max(1, int(file_size) // 512)}")
    if seccomp is not None:
        steps.append(f"seccomp={seccomp}")
    for path in join:
        if path.startswith(_STEPS) or path == "--" or not path.startswith("/"):
            raise ValueError(f"not an absolute cgroup.procs path: {path!r}")
        steps.append(path)
    if not steps:
        return list(argv)
    return [SHELL, "-c", SCRIPT, "ipybox-limits", *steps, "--", *argv]
