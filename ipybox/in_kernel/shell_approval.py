"""Shell-command approval inside the kernel (IPython extension), as ipybox 0.9.2's `approve_shell_cmds`.

`kernel_main` loads it when `SHELL_APPROVAL_ENV` is set; a client that did not start the kernel calls
[install][ipybox.in_kernel.shell_approval.install] from its init code instead. Before a shell command of
the cell runs, the kernel asks the tool server (`{"op": "shell"}` on the call channel, see
[approve_shell][ipybox.in_kernel.tool_runner.approve_shell]); the application sees
`ApprovalRequest(server_name="ipybox", tool_name="shell" | "shell_magic", tool_args={"cmd": ...})`.
A rejection (or no decision in time) raises `ApprovalRejectedError` (`ApprovalTimeoutError`) in the
cell, and the command has not run.

What asks:
- `!cmd`, `x = !cmd`, `!!cmd`, `%sx`/`%system`/`%%!`, `%pip`/`%uv`/`%conda` and aliases such as `%rm`: IPython
  sends all of them through `shell.system` or `shell.getoutput` (`system_piped`/`system_raw` are hooked too).
  Kind `shell`, args `{"cmd": command}`.
- The script cell magics: `%%bash` and `%%sh` as kind `shell_magic` with `{"cmd": cell}` (0.9.2's
  request), every other one of `ScriptMagics` (`%%script`, `%%perl`, `%%ruby`, `%%python3`, ...) with
  `{"cmd": cell, "magic": "<name> <line>"}`, so the approver knows which program gets the cell.

The command the approver sees is the one that runs. IPython expands `{expr}` and `$name` in a shell
command inside `system`/`getoutput`, evaluating the expression there. The hooks expand it once, with
IPython's own `var_expand` at the caller's frame (a function's locals included, exactly the frame IPython
would use), ask about that string, then run it with expansion switched off, so `{f()}` is evaluated once
and `{{x}}` stays `{x}`, as it does without approval. A script magic's cell is not expanded by IPython:
the approver sees it as it is.

Mode `escape` (0.9.2's `require_shell_escape`) also makes direct process starts from cell code raise
`RuntimeError` naming the `!` form: `subprocess.Popen` (so `run`, `call`, `check_output`, `os.popen`),
`os.system`, `os.exec*`, `os.spawn*`, `os.posix_spawn*` and `pty.spawn`. An approved command is let through
by a context variable set around it: the calling thread sees it, the forked child of IPython's pexpect
inherits it, and the script magics' subprocess, started on IPython's event-loop thread through
`run_coroutine_threadsafe`, runs in a copy of the caller's context, so it sees it too (checked by the tests);
a thread that cell code starts itself does not. A forked child (`os.fork()` then `os.execv`) that is refused
exits with status 127 instead of raising: raising would leave a copy of the kernel running cell code.

This is a guard against an agent running commands unasked, NOT a security boundary: cell code runs in the
same interpreter and can undo every hook here (restore `subprocess.Popen.__init__`, call `_posixsubprocess`,
use `ctypes`, ...). Containing code that tries is the sandbox's job (`sandbox=True`).

Tracebacks show the user's line as written (`----> 1 !rm -rf x`, `----> 1 %%bash`) and nothing of ipybox.
The hooks set `__tracebackhide__`, but IPython 9 still shows the frame an exception was raised in, and
shows a `!` line as compiled (`get_ipython().system('rm -rf x')`); so the shell's traceback formatter is
wrapped to drop this module's frames (and the tool runner's below them) from a traceback that passes
through a hook, and to show that hook's call in its `!`/`%%` form. Other tracebacks are left as they are.

Cost when off: `kernel_main` imports this module for its constants only, 0.3 ms (its imports are already
loaded by ipykernel); the tool runner is imported by the first command, IPython's script magics and `pty`
by `install`. `install` takes about 10 ms (measured): loading IPython's `ScriptMagics` 8 ms (IPython 9
would otherwise load it on the first `%%bash`), `pty` 2.5 ms (mode `escape`), the hooks under 1 ms.

Runs inside kernels: standard library only (and the `ipython` shell object it is given).
"""

from __future__ import annotations

import contextvars
import functools
import os
from collections.abc import Callable
from types import TracebackType
from typing import Any

SHELL_APPROVAL_ENV = "IPYBOX_SHELL_APPROVAL"
"""`ask`: ask before shell commands run; `escape`: also require the `!` form for starting processes."""

EXTENSION = "ipybox.in_kernel.shell_approval"

MODES = ("ask", "escape")

_STATE = "_ipybox_shell_approval"
_HOOKED = "_ipybox_shell_hook"

# Set around a command that was approved: the process starts it makes are allowed (mode `escape`).
_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar("ipybox_shell_allowed", default=False)
# Set around running an approved command that was already expanded: `var_expand` leaves it as it is.
_verbatim: contextvars.ContextVar[bool] = contextvars.ContextVar("ipybox_shell_verbatim", default=False)


class _Approval:
    """Where to ask, per shell (updated when `install` runs again)."""

    def __init__(self, address: str | None, token: str | None) -> None:
        self.address = address
        self.token = token
        self.escape = False


def install(ip: Any, mode: str, *, address: str | None = None, token: str | None = None) -> None:
    """Make shell commands in the kernel of `ip` (an IPython `InteractiveShell`) ask first.

    Installing again updates where to ask (`address`/`token` when given) and can switch `ask` to
    `escape`; it never turns a guard off.

    Args:
        ip: The kernel's shell (`get_ipython()`).
        mode: `"ask"`, or `"escape"` to also refuse process starts that bypass the `!` form.
        address: The tool server's call channel (`unix:PATH` or `tcp://HOST:PORT`); default: the kernel's
            `IPYBOX_TOOL_SERVER`, read when a command asks.
        token: The call token; default: the kernel's `IPYBOX_TOOL_TOKEN`.

    Raises:
        ValueError: `mode` is not `"ask"` or `"escape"`.
    """
    if mode not in MODES:
        raise ValueError(f"shell approval mode must be one of {MODES}, not {mode!r}")
    state: _Approval | None = getattr(ip, _STATE, None)
    if state is None:
        state = _Approval(address, token)
        _hook_shell(ip, state)
        _hook_script_magics(ip, state)
        _hook_tracebacks(ip)
        setattr(ip, _STATE, state)
    else:
        state.address = address if address is not None else state.address
        state.token = token if token is not None else state.token
    if mode == "escape" and not state.escape:
        _guard_process_starts(os.getpid())
        state.escape = True


def load_ipython_extension(ip: Any) -> None:
    mode = os.environ.get(SHELL_APPROVAL_ENV)
    if not mode:
        return
    # Raises on a bad mode: `kernel_main` makes a failed load stop the kernel (fail closed).
    install(ip, mode)


def _ask(state: _Approval, kind: str, cmd: str, magic: str | None = None) -> None:
    __tracebackhide__ = True
    from ipybox.in_kernel.tool_runner import approve_shell

    approve_shell(kind, cmd, magic, address=state.address, token=state.token)


def _run_approved(run: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    __tracebackhide__ = True
    verbatim, allowed = _verbatim.set(True), _allowed.set(True)
    try:
        return run(*args, **kwargs)
    finally:
        _allowed.reset(allowed)
        _verbatim.reset(verbatim)


def _hook_shell(ip: Any, state: _Approval) -> None:
    expand = ip.var_expand

    @functools.wraps(expand)
    def var_expand(cmd: str, depth: int = 0, *args: Any, **kwargs: Any) -> Any:
        if _verbatim.get():
            return cmd
        # One frame more: this wrapper sits between IPython's `var_expand` and its caller.
        return expand(cmd, depth + 1, *args, **kwargs)

    ip.var_expand = var_expand

    # Instance attributes shadow the class's methods; the originals (bound) call each other through the
    # class, so an approved command is asked about once.
    for name in ("system", "system_piped", "system_raw"):
        original = getattr(ip, name)

        def system(cmd: str, _run: Callable[[str], Any] = original, _name: str = name) -> Any:
            __tracebackhide__ = True
            _shown = (f"get_ipython().{_name}({cmd!r})", f"!{cmd}")  # read by _cut_traceback
            command = ip.var_expand(cmd, depth=1)  # as IPython's `system` does: at our caller's frame
            _ask(state, "shell", command)
            return _run_approved(_run, command)

        setattr(system, _HOOKED, True)
        setattr(ip, name, functools.wraps(original)(system))

    getoutput = ip.getoutput

    def hooked_getoutput(cmd: str, split: bool = True, depth: int = 0) -> Any:
        __tracebackhide__ = True
        _shown = (f"get_ipython().getoutput({cmd!r})", f"!{cmd}")  # read by _cut_traceback
        command = ip.var_expand(cmd, depth=depth + 1)
        _ask(state, "shell", command)
        return _run_approved(getoutput, command, split=split, depth=depth)

    setattr(hooked_getoutput, _HOOKED, True)
    ip.getoutput = functools.wraps(getoutput)(hooked_getoutput)


def _hook_script_magics(ip: Any, state: _Approval) -> None:
    # IPython 9 declares its magics lazily: finding `%%script` imports and registers `ScriptMagics`, so the
    # magics wrapped below are the real ones, which a later lazy load does not replace.
    ip.find_cell_magic("script")
    script_magics = ip.magics_manager.registry.get("ScriptMagics")
    names = ["script", *getattr(script_magics, "script_magics", ("sh", "bash"))]
    cell_magics = ip.magics_manager.magics["cell"]
    for name in names:
        magic = ip.find_cell_magic(name)
        if magic is None or getattr(magic, _HOOKED, False):
            continue
        cell_magics[name] = _asking_magic(state, name, magic)


def _asking_magic(state: _Approval, name: str, magic: Callable[..., Any]) -> Callable[..., Any]:
    # 0.9.2 asked `{"cmd": cell}` for %%bash and %%sh; others also say which program gets the cell.
    bare = name in ("bash", "sh")

    # `wraps` keeps the attributes `run_cell_magic` reads (no var expand, local scope, silencing).
    @functools.wraps(magic)
    def asking(line: str, cell: str, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        _shown = (  # read by _cut_traceback
            f"get_ipython().run_cell_magic({name!r}, {line!r}, {cell!r})",
            f"%%{name} {line}".rstrip(),
        )
        _ask(state, "shell_magic", cell, None if bare else f"{name} {line}".strip())
        return _run_approved(magic, line, cell, *args, **kwargs)

    setattr(asking, _HOOKED, True)
    return asking


def _hook_tracebacks(ip: Any) -> None:
    formatter = ip.InteractiveTB
    structured_traceback = formatter.structured_traceback

    @functools.wraps(structured_traceback)
    def without_hooks(etype: Any, evalue: Any, etb: Any = None, *args: Any, **kwargs: Any) -> Any:
        shown = _cut_traceback(etb)
        seen = set()
        chained = evalue
        while isinstance(chained, BaseException) and id(chained) not in seen:
            seen.add(id(chained))
            shown += _cut_traceback(chained.__traceback__)
            chained = chained.__cause__ or (None if chained.__suppress_context__ else chained.__context__)
        lines = structured_traceback(etype, evalue, etb, *args, **kwargs)
        for call, form in shown:
            lines = [line.replace(call, form) for line in lines]
        return lines

    formatter.structured_traceback = without_hooks


def _cut_traceback(tb: TracebackType | None) -> list[tuple[str, str]]:
    """Drop this module's frames (and all below them) from `tb`, in place; return how to show the line that
    called the first of them (`get_ipython().system('ls')` as `!ls`).

    IPython shows the frame an exception was raised in even when it sets `__tracebackhide__`, so without
    this a rejected `!cmd` ends in this module's and the tool runner's code.
    """
    previous = None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_globals.get("__name__") == __name__:
            if previous is None:  # nothing of the user's above it: leave it as it is
                return []
            previous.tb_next = None
            shown = frame.f_locals.get("_shown")
            return [shown] if isinstance(shown, tuple) else []
        previous, tb = tb, tb.tb_next
    return []


_OS_STARTS = (
    "system",
    *("execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe"),
    *("spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe"),
    *("posix_spawn", "posix_spawnp"),
)


def _refusal(label: str) -> str:
    # Starts with ipybox 0.9.2's exact text (callers match on it): `subprocess` for `Popen`, the function's
    # name for the others.
    named = "subprocess" if label == "subprocess.Popen()" else label
    return (
        f"Direct {named} calls are not allowed. Use ! syntax. (require_shell_escape: `!cmd`, `x = !cmd` "
        "and %%bash cells ask for approval first.)"
    )


def _refuse(label: str, kernel_pid: int) -> None:
    __tracebackhide__ = True
    message = _refusal(label)
    if os.getpid() != kernel_pid:
        # A forked child of the kernel: raising would run the kernel's code on in the child.
        os.write(2, f"ipybox: {message}\n".encode())
        os._exit(127)
    raise RuntimeError(message)


def _guarded(function: Callable[..., Any], label: str, kernel_pid: int) -> Callable[..., Any]:
    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if not _allowed.get():
            _refuse(label, kernel_pid)
        return function(*args, **kwargs)

    setattr(guarded, _HOOKED, True)
    return guarded


def _guard_process_starts(kernel_pid: int) -> None:
    import pty
    import subprocess

    for name in _OS_STARTS:
        function = getattr(os, name, None)
        if function is not None and not getattr(function, _HOOKED, False):
            setattr(os, name, _guarded(function, f"os.{name}()", kernel_pid))
    if not getattr(pty.spawn, _HOOKED, False):
        pty.spawn = _guarded(pty.spawn, "pty.spawn()", kernel_pid)
    # `__init__` of the class itself, not a subclass in the module: code (IPython's included) that took
    # `Popen` before this ran is guarded too, and `isinstance` checks keep working.
    init = subprocess.Popen.__init__
    if not getattr(init, _HOOKED, False):
        subprocess.Popen.__init__ = _guarded(init, "subprocess.Popen()", kernel_pid)  # type: ignore[method-assign]
