"""Whether this process runs in a container, and what that means for the sandbox.

Inside a container the container is the isolation boundary. bubblewrap needs to create user, PID, network
and mount namespaces, and container runtimes' default confinement forbids exactly that: Docker's default
seccomp profile refuses `unshare`/`clone` with namespace flags to a process without CAP_SYS_ADMIN, its
default AppArmor profile (where AppArmor is on) refuses `mount`, and the masked paths over `/proc` make the
kernel refuse a fresh `proc` mount. Measured with Docker 20.10 and ipybox's image (bubblewrap 0.8, as
its non-root user): by default "No permissions to create new namespace"; with `seccomp=unconfined` alone
"Can't mount proc on /newroot/proc"; with `systempaths=unconfined` alone the first error again; with
`--cap-add SYS_ADMIN` "pivot_root: Operation not permitted"; with both `seccomp=unconfined` and
`systempaths=unconfined`, or `--privileged`, a sandbox starts. That machine had no AppArmor, so the
AppArmor option is from Docker's documentation. So a container either runs kernels unsandboxed, relying
on the container, or is started with its own confinement loosened so that bubblewrap can nest.

ipybox never decides that on its own: a workspace that enables the sandbox fails closed in a container
that can't nest it, with `container_remedy`'s explanation, and `ipybox doctor` reports the same.

How a container is recognised, first match wins (each is what the runtime leaves behind, none is proof of
isolation, so this only ever chooses words, never whether to sandbox):
- `IPYBOX_IN_CONTAINER=1`, which ipybox's image sets (and `IPYBOX_IN_CONTAINER=0`: not a container,
  whatever else says so, e.g. a development container whose user namespaces are switched off on purpose);
- `/.dockerenv` (Docker) and `/run/.containerenv` (Podman);
- the `container` environment variable (systemd-nspawn, LXC, Podman);
- PID 1's cgroup naming a container runtime (Docker, containerd, Kubernetes, LXC, Podman).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# Set by ipybox's container image (Dockerfile): the one signal that this is *our* image, whose default is
# to run kernels unsandboxed and say so.
IMAGE_ENV = "IPYBOX_IN_CONTAINER"

_MARKER_FILES = (("/.dockerenv", "Docker"), ("/run/.containerenv", "Podman"))
_CGROUP_WORDS = ("docker", "containerd", "kubepods", "libpod", "lxc")

# The `docker run` options that let bubblewrap nest (each lifts one of the three obstacles above).
NESTING_FLAGS = "--security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt systempaths=unconfined"


def detect_container(root: Path = Path("/"), environ: Mapping[str, str] | None = None) -> str | None:
    """What shows that this process runs in a container, or None when nothing does.

    Args:
        root: The filesystem root to look in (tests pass a directory of their own).
        environ: The environment to look in (default: this process's).

    Returns:
        A short description of the evidence, e.g. "Docker: /.dockerenv".
    """
    env = os.environ if environ is None else environ
    if env.get(IMAGE_ENV) == "1":
        return f"ipybox's image: {IMAGE_ENV}=1"
    if env.get(IMAGE_ENV) == "0":
        return None
    for path, runtime in _MARKER_FILES:
        if (root / path.lstrip("/")).exists():
            return f"{runtime}: {path}"
    if env.get("container"):
        return f"container={env['container']}"
    try:
        cgroup = (root / "proc/1/cgroup").read_text(errors="replace")
    except OSError:
        return None
    for word in _CGROUP_WORDS:
        if word in cgroup:
            return f"PID 1's cgroup names {word}"
    return None


def container_remedy(evidence: str) -> str:
    """Why bubblewrap cannot sandbox in the container `evidence` describes, and the two ways on.

    One text for the error a workspace that enables the sandbox fails with and for `ipybox doctor`.
    """
    return (
        f"this is a container ({evidence}), and its runtime's default confinement (seccomp, AppArmor, "
        "masked /proc) forbids the namespaces bubblewrap needs, so the sandbox cannot nest. The container "
        "itself is the isolation boundary: either run kernels unsandboxed inside it (`enabled = false` "
        "under [sandbox] in ipybox.toml, or sandbox=False), or start the container with "
        f"`{NESTING_FLAGS}` so that bubblewrap can nest, which loosens the container's own confinement "
        "(every system call allowed, /proc and /sys unmasked); `--privileged` works too but removes that "
        "confinement altogether"
    )


def unsandboxed_note(sandboxed: bool, environ: Mapping[str, str] | None = None) -> str | None:
    """The line `ipybox mcp` prints on stderr in ipybox's image when kernels run unsandboxed, else None.

    Only in the image (`IPYBOX_IN_CONTAINER=1`), not wherever a container is guessed: elsewhere running
    unsandboxed is what the workspace's owner chose, and says nothing new.
    """
    env = os.environ if environ is None else environ
    if sandboxed or env.get(IMAGE_ENV) != "1":
        return None
    return (
        "ipybox: kernels run unsandboxed: the container is the isolation boundary "
        "(`ipybox doctor` explains; `enabled = true` under [sandbox] needs a container bubblewrap can nest in)"
    )
