"""The filesystem a bubblewrap sandbox sees: decided when the process starts, from what exists then.

Contract: a name that the policy hides or protects can be neither read, nor created, nor replaced from
inside, also when the host creates, rotates or atomically replaces it later (an editor that saves by
rename, `sed -i`, `register_mcp_server`).

Why it is built this way: bubblewrap protects a path by mounting over it, and a mount sits on a
directory entry. Mounted over an entry of a *host* directory that the sandbox may write, it fails in
three ways: a missing name is not covered (a kernel creates `.env` or `ipybox.toml`), a name the host
replaces by rename loses its mount in every other mount namespace (Linux detaches it, so the kernel can
then write the new `ipybox.toml`), and a name the host creates later (a rotated `.env`) is visible.
Here every directory that holds a hidden or protected name is *frozen* instead: inside the sandbox it is
a read-only tmpfs holding one mount per entry that existed at start (read-write, read-only, or left out),
so all mount points live in the sandbox's own tmpfs, where the host can neither replace nor add names.
Frozen are: the workspace (its protected names: `ipybox.toml`, `.git`, `.ipybox`, ...), each of its
parents (their `.env` files), and the directories of the policy's hidden and protected paths (the home
directory for `~/.ssh`, ...), with their ancestors.

Beside the workspace (`View.hidden_beside`): each directory of the workspace's parent that holds a name
of those patterns when the sandbox starts (another project's `.env`, another workspace's `.ipybox`) is
frozen with those names hidden, found anew at each start (one listing of the parent and of each of its
directories, stopped at the first match). A directory that holds none then is left as it is, so the cost
is a mount per entry of the directories that hold secrets, not of all of them; a secret made later in
one that held none shows up in sandboxes started before it (not in those started after). Under the
private `/tmp` nothing beside the workspace is visible: nothing is looked for there.

Extra paths inside a writable tree (an `allowWrite` path below a top-level entry of the workspace, or below
another `allowWrite` path; a socket or readable path there) are not bound on their own: the sandbox sees
them, writable, through that tree already, and a kernel can replace them, or a directory on their way, by
a symlink, which a bind of their own would follow on the host at the next start (binding the link's target
read-write, or failing every later start when it points nowhere).

What follows for a process inside: it can't create or remove entries at the top level of the workspace
(`EROFS`, or `EBUSY` for a rename or removal of an entry), everything below those entries behaves as
before; entries the host adds to a frozen directory later show up in sandboxes started after that.

Paths that vanish: the mounts are computed at each start from what exists then, and every bind of a host
path is a `*-try` bind, so a hidden or bound path that is gone (a parent's `.env` deleted, even between the
listing and bubblewrap's mount) is simply absent inside, which is as good as hidden; one that is back is
listed, hence hidden, at the next start. Nothing hidden is bound by a path found once when the gateway
started: such a bind failed every later kernel start once its path was gone.

The private `/tmp` and its size: bubblewrap's `/tmp` and `/dev` are tmpfs, that is memory, and without a
size each may grow to half the host's RAM (measured: writing to `/dev` itself or to `/dev/shm`, a directory of
the `/dev` tmpfs, worked as `nobody` too). With `View.tmp_size` the private `/tmp` is a tmpfs of that many
bytes (`--size`), `/dev/shm` (POSIX shared memory, `multiprocessing`'s semaphores) a tmpfs of its own of the
same size, and `/dev` read-only, so the sandbox's in-memory files are bounded by twice `tmp_size`; writing
past it is `ENOSPC` ("No space left on device") in the process, which keeps running. Without a size the
mounts are what they always were.

Kept stdlib-only: the kernel launcher ([launch][ipybox.sandbox.launch]) imports it for every kernel start.
"""

from __future__ import annotations

import glob
import os
import posixpath
import stat
from fnmatch import fnmatchcase

# Not `typing`/`dataclasses`: importing them (and `inspect`) would cost a third of the launcher's start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_GLOB_CHARS = frozenset("*?[")
# Mounted by bubblewrap itself: `--proc`, `--dev` and a private `/tmp`.
_SPECIAL = {"/proc": ["--proc", "/proc"], "/dev": ["--dev", "/dev"], "/tmp": ["--tmpfs", "/tmp"]}
_PRIVATE_TMP = "/tmp"
_SHM = "/dev/shm"


class PathRule:
    """Names under `base` (a literal absolute directory): `pattern` is relative, literal or a glob.

    A one-component pattern (`.env*`, `ipybox.toml`) covers names created later too; a deeper glob is
    expanded when the sandbox starts.
    """

    def __init__(self, base: str, pattern: str) -> None:
        self.base = base
        self.pattern = pattern

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PathRule) and (self.base, self.pattern) == (other.base, other.pattern)

    def __hash__(self) -> int:
        return hash((self.base, self.pattern))

    def __repr__(self) -> str:
        return f"PathRule({self.base!r}, {self.pattern!r})"


class View:
    """What a sandbox sees, as data (JSON for the kernel launcher).

    Attributes:
        workspace: The working directory: read-write but for `protected`; always frozen.
        writable: More paths bound read-write (allowWrite directories, a kernel's ipc directory).
        readable: Paths kept visible read-only where they would not be (under the private `/tmp`).
        sockets: Host Unix sockets the sandbox may connect to.
        hidden: Absent inside, whether they exist now or later.
        protected: Read-only inside writable trees, and impossible to create there.
        hidden_beside: Name patterns hidden in each directory beside the workspace that holds one when
            the sandbox starts (see the module).
        tmp_size: The private `/tmp`'s size in bytes (and `/dev/shm`'s; `/dev` is then read-only), or
            `None`: as large as the host lets a tmpfs be (half its RAM).

    Raises:
        ValueError: `tmp_size` is not a whole number of bytes above zero.
    """

    def __init__(
        self,
        workspace: str,
        writable: list[str] | None = None,
        readable: list[str] | None = None,
        sockets: list[str] | None = None,
        hidden: list[PathRule] | None = None,
        protected: list[PathRule] | None = None,
        tmp_size: int | None = None,
        hidden_beside: list[str] | None = None,
    ) -> None:
        self.workspace = workspace
        self.writable = list(writable or [])
        self.readable = list(readable or [])
        self.sockets = list(sockets or [])
        self.hidden = list(hidden or [])
        self.protected = list(protected or [])
        self.tmp_size = tmp_size
        self.hidden_beside = list(hidden_beside or [])

    @property
    def tmp_size(self) -> int | None:
        return self._tmp_size

    @tmp_size.setter
    def tmp_size(self, size: int | None) -> None:
        # Checked here, not left to bubblewrap: it refuses 0 with a message naming `--size` (which the
        # user never wrote), and a tmpfs `size=0` would mean no limit at all.
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
            raise ValueError(
                f"the private /tmp's size must be a whole number of bytes above zero, not {size!r}; "
                "leave it out (None) for no limit"
            )
        self._tmp_size = size

    def to_json(self) -> dict[str, Any]:
        rules = {key: [vars(rule) for rule in getattr(self, key)] for key in ("hidden", "protected")}
        return {
            "workspace": self.workspace,
            "writable": self.writable,
            "readable": self.readable,
            "sockets": self.sockets,
            **rules,
            "tmp_size": self.tmp_size,
            "hidden_beside": self.hidden_beside,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> View:
        return cls(
            workspace=data["workspace"],
            writable=list(data.get("writable", [])),
            readable=list(data.get("readable", [])),
            sockets=list(data.get("sockets", [])),
            hidden=[PathRule(**rule) for rule in data.get("hidden", [])],
            protected=[PathRule(**rule) for rule in data.get("protected", [])],
            # Absent from plans written before sizes existed: no limit, as then.
            tmp_size=data.get("tmp_size"),
            hidden_beside=list(data.get("hidden_beside", [])),
        )


def mount_args(view: View) -> list[str]:
    """bubblewrap options that build `view`'s filesystem (everything but namespaces and environment)."""
    return _Planner(view).args()


def rules_beside(workspace: str, patterns: list[str]) -> list[PathRule]:
    """Rules hiding `patterns` in each directory beside `workspace` (an entry of its parent, a symlink to a
    directory included) that holds a name matching one of them now; none under the private `/tmp`."""
    workspace = posixpath.normpath(workspace)
    parent = posixpath.dirname(workspace)
    if not patterns or parent == workspace or _under(parent, _PRIVATE_TMP):
        return []
    try:
        with os.scandir(parent) as entries:
            siblings = [posixpath.join(parent, entry.name) for entry in entries if entry.is_dir()]
    except OSError:
        return []
    rules = []
    for sibling in siblings:
        if sibling == workspace or sibling in _SPECIAL or sibling == "/sys":
            continue
        try:
            with os.scandir(sibling) as entries:
                holds = any(fnmatchcase(entry.name, pattern) for entry in entries for pattern in patterns)
        except OSError:
            # Not listable (`chmod 711`): a name can still be opened if known, so the patterns' own
            # literal names are looked for (frozen, such a directory shows only what the view needs).
            holds = any(os.path.lexists(posixpath.join(sibling, p.rstrip("*?["))) for p in patterns)
        if holds:
            rules += [PathRule(sibling, pattern) for pattern in patterns]
    return rules


def _parents(path: str) -> list[str]:
    """`path`'s ancestors, nearest first, `/` last."""
    found = []
    while path != "/":
        path = posixpath.dirname(path)
        found.append(path)
    return found


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _has_glob(text: str) -> bool:
    return any(char in _GLOB_CHARS for char in text)


class _Planner:
    def __init__(self, view: View) -> None:
        self.workspace = posixpath.normpath(view.workspace)
        self.tmp_size = view.tmp_size
        self.writable = [self.workspace, *(posixpath.normpath(p) for p in view.writable)]
        self.hidden_names = self._names([*view.hidden, *rules_beside(self.workspace, view.hidden_beside)])
        protected = self._names(view.protected)
        # A protected name only matters where the sandbox could write; elsewhere everything is read-only.
        self.protected_names = {
            base: patterns for base, patterns in protected.items() if self._writable_at(base)
        }
        self.extra_paths = [(posixpath.normpath(p), "--bind-try") for p in (*view.writable, *view.sockets)]
        self.extra_paths += [(posixpath.normpath(p), "--ro-bind-try") for p in view.readable]
        # `/`, `/tmp`, `/proc` and `/dev` are the sandbox's own: never replaced by a host bind.
        self.extra_paths = [item for item in self.extra_paths if item[0] not in ("/", *_SPECIAL)]
        self.frozen = self._frozen_dirs()
        self.emitted: set[str] = set()  # entries bound while listing frozen directories
        self.writable_trees: set[str] = set()  # bound read-write as a whole: the sandbox's to change below

    # -- rules

    def _names(self, rules: list[PathRule]) -> dict[str, list[str]]:
        """Rules as {directory: [name patterns]}, deeper globs expanded to what exists now."""
        names: dict[str, list[str]] = {}

        def add(path: str, literal: bool) -> None:
            path = posixpath.normpath(path)
            if path == "/":
                return
            parent, name = posixpath.split(path)
            # The directory as the sandbox reaches it: a home behind a symlink is frozen where it lives.
            names.setdefault(os.path.realpath(parent), []).append(glob.escape(name) if literal else name)
            # A hidden or protected symlink: its target is covered too (what the name stands for).
            if literal and os.path.islink(path):
                target = os.path.realpath(path)
                if target != "/" and target != path:
                    t_parent, t_name = posixpath.split(target)
                    names.setdefault(t_parent, []).append(glob.escape(t_name))

        for rule in rules:
            base = os.path.realpath(rule.base)
            pattern = rule.pattern.strip("/")
            if not pattern:
                add(base, literal=True)
            elif "/" not in pattern:
                if _has_glob(pattern):
                    names.setdefault(base, []).append(pattern)
                    # Existing symlinks among the matches: hide or protect their targets too.
                    for match in _glob_in(base, pattern):
                        add(match, literal=True)
                else:
                    add(posixpath.join(base, pattern), literal=True)
            elif _has_glob(pattern):
                for match in _glob_in(base, pattern):
                    add(match, literal=True)
            else:
                add(posixpath.join(base, pattern), literal=True)
        return names

    def _writable_at(self, path: str) -> bool:
        return any(_under(path, root) for root in self.writable)

    def _frozen_dirs(self) -> set[str]:
        frozen = {"/", self.workspace}
        for base in (*self.hidden_names, *self.protected_names):
            for path in (base, *_parents(base)):
                # The private /tmp hides what the host keeps there: nothing to list but the workspace.
                if _under(path, _PRIVATE_TMP) and not _under(path, self.workspace):
                    continue
                frozen.add(path)
        # A bind over a frozen directory would undo it: a writable or readable tree that holds one is
        # frozen itself (its entries are bound one by one instead).
        for path, _option in self.extra_paths:
            if path not in frozen and any(_under(f, path) for f in frozen if f != "/"):
                frozen.update(
                    p for p in (path, *_parents(path)) if not (_under(p, _PRIVATE_TMP) and p != path)
                )
        return frozen

    def _matches(self, names: dict[str, list[str]], path: str) -> bool:
        parent, name = posixpath.split(path)
        return any(fnmatchcase(name, pattern) for pattern in names.get(parent, ()))

    def _hidden(self, path: str) -> bool:
        return any(self._matches(self.hidden_names, p) for p in (path, *_parents(path)) if p != "/")

    # -- mounts

    def args(self) -> list[str]:
        args: list[str] = []
        remount: list[str] = []
        self._emit_dir("/", args, remount)
        # Frozen trees inside the private /tmp (a workspace there): their parents are plain directories
        # of that tmpfs, which hide the host's.
        for path in sorted(self.frozen):
            if (
                path != _PRIVATE_TMP
                and _under(path, _PRIVATE_TMP)
                and posixpath.dirname(path) not in self.frozen
            ):
                self._emit_dir(path, args, remount)
        for path, option in sorted(self.extra_paths, key=lambda item: item[0].count("/")):
            if (
                path not in self.emitted
                and path not in self.frozen
                and not self._hidden(path)
                and not self._in_writable_tree(path)
            ):
                args += [option, path, path]
                if option == "--bind-try":  # shallower first: a deeper path finds its tree here
                    self.writable_trees.add(path)
        for path in remount:
            args += ["--remount-ro", path]
        return args

    def _in_writable_tree(self, path: str) -> bool:
        """Whether a directory above `path` is bound read-write as a whole (see the module docstring)."""
        for parent in _parents(path):
            if parent in self.frozen:  # a read-only tmpfs: nothing above it is bound as a whole
                return False
            if parent in self.writable_trees:
                return True
        return False

    def _special_args(self, remount: list[str]) -> list[str]:
        """`/proc`, `/dev` and the private `/tmp`; with a size, `/dev/shm` too (see the module docstring)."""
        if self.tmp_size is None:
            return [arg for special in _SPECIAL.values() for arg in special]
        size = ["--size", str(self.tmp_size)]
        # `--dev` makes /dev an unsized tmpfs with /dev/shm a plain directory of it: either could hold
        # gigabytes past the /tmp limit. /dev/shm gets a sized tmpfs of its own, /dev itself turns
        # read-only (non-recursive: /dev/shm, /dev/pts and the device binds stay as they are).
        remount.append("/dev")
        return [*_SPECIAL["/proc"], *_SPECIAL["/dev"], *size, "--tmpfs", _SHM, *size, *_SPECIAL["/tmp"]]

    def _emit_dir(self, directory: str, args: list[str], remount: list[str]) -> None:
        if directory == "/":
            args += self._special_args(remount)
        elif directory != self.workspace and self._hidden(directory):
            return
        else:
            args += ["--tmpfs", directory]
        remount.append(directory)
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError:
            # Not listable by this user: only the entries the view needs are shown (below), nothing else.
            entries = []
        listed = set()
        for entry in entries:
            path = entry.path if directory != "/" else "/" + entry.name
            listed.add(path)
            if path in _SPECIAL:
                continue
            if self._matches(self.hidden_names, path):
                # Present but unreadable (a hidden one made later is simply absent): an empty read-only
                # directory, or a file that can't be opened (a device on a nodev mount: EACCES).
                if entry.is_dir(follow_symlinks=False):
                    args += ["--tmpfs", path]
                    remount.append(path)
                else:
                    args += ["--ro-bind-try", "/dev/null", path]
                continue
            if path in self.frozen:
                self._emit_dir(path, args, remount)
            elif entry.is_symlink():
                try:
                    args += ["--symlink", os.readlink(path), path]
                except OSError:
                    continue
            else:
                writable = self._writable_at(path) and not self._matches(self.protected_names, path)
                args += ["--bind-try" if writable else "--ro-bind-try", path, path]
                self.emitted.add(path)
                if writable:
                    self.writable_trees.add(path)
        # Frozen directories this user can't list but can pass through (`chmod 711`), and the workspace.
        for path in sorted(self.frozen):
            child = posixpath.dirname(path) == directory and path not in ("/", *listed, *_SPECIAL)
            if child and _is_dir(path):
                self._emit_dir(path, args, remount)


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


def _glob_in(base: str, pattern: str) -> list[str]:
    # The base is literal (a workspace named `ws[1]` is not a pattern); only `pattern` is one.
    return sorted(glob.glob(posixpath.join(glob.escape(base), pattern), include_hidden=True))
