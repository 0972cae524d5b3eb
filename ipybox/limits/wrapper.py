"""The command line that starts a process inside its limits: `limited_argv`.

A process must be in its control group and under its rlimits *before* it starts, and so must everything
it forks from its first instruction on (bubblewrap forks the sandboxed kernel at once): moving it after
`fork` would race those children. So the command runs under a small POSIX shell script that joins the
group (writes its own pid to `cgroup.procs`), sets the rlimits (`ulimit`, soft and hard: the process can't
raise them again, short of CAP_SYS_RESOURCE, which only an unsandboxed kernel running as root has) and
`exec`s the command. It costs about 0.5 ms per start; a Python launcher would cost 12 ms (measured on
this machine: `sh -c` 1.1 ms, `python -I -S` 12.5 ms, `/bin/true` 0.6 ms).

Nothing in the script comes from its arguments as code: paths and numbers are passed as positional
arguments, which the script only compares, writes and hands to `ulimit`. A step that fails stops the start
with exit status 125 (the shell's message names the file or limit); the process never runs unlimited.
"""

from __future__ import annotations

from collections.abc import Sequence

SHELL = "/bin/sh"
FAILED_STATUS = 125
SCRIPT = f"""\
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
  case "$1" in
    nofile=*) ulimit -n "${{1#nofile=}}" || exit {FAILED_STATUS} ;;
    nproc=*) ulimit -u "${{1#nproc=}}" 2>/dev/null || ulimit -p "${{1#nproc=}}" || exit {FAILED_STATUS} ;;
    as=*) ulimit -v "${{1#as=}}" || exit {FAILED_STATUS} ;;
    *) echo "$$" > "$1" || exit {FAILED_STATUS} ;;
  esac
  shift
done
shift
exec "$@"
"""
"""dash (Debian's `/bin/sh`) calls the process limit `-p`, bash `-u` (its `-p` is the pipe size, which it
refuses to set): `-u` first, quietly."""


def limited_argv(
    argv: Sequence[str],
    *,
    join: Sequence[str] = (),
    open_files: int | None = None,
    processes: int | None = None,
    address_space: int | None = None,
) -> list[str]:
    """`argv`, started in the groups of `join` (their `cgroup.procs` files) and under the rlimits given.

    Args:
        argv: The command.
        join: `cgroup.procs` files to write the process's pid to.
        open_files: RLIMIT_NOFILE.
        processes: RLIMIT_NPROC (of the user: see `ResourceLimits.processes`).
        address_space: RLIMIT_AS, in bytes (rounded down to KiB, `ulimit -v`'s unit).

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
    for path in join:
        if path.startswith(("nofile=", "nproc=", "as=")) or path == "--" or not path.startswith("/"):
            raise ValueError(f"not an absolute cgroup.procs path: {path!r}")
        steps.append(path)
    if not steps:
        return list(argv)
    return [SHELL, "-c", SCRIPT, "ipybox-limits", *steps, "--", *argv]
