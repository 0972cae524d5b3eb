"""The client that generated tool modules use, inside the kernel, to run MCP tools on the tool server.

It imports only the standard library, so that the first tool call in a fresh kernel costs milliseconds,
and keeps one persistent connection per thread to the tool server's call channel (a Unix socket by
default), speaking one JSON object per line each way (`ipybox.in_kernel.call_protocol`).
The kernel only ever sends a server *name*, a tool name and arguments (and, from generated modules, the
root their package sits in): which process or URL backs that name is decided on the host.

A request starts with its token, so the channel can charge a large request to its caller before reading
it all. The channel closes a connection left idle (minutes): one found closed before a request is sent is
replaced at once, and one the channel closed with an `idle_timeout` line in place of an answer (the close
crossed the request) gets the request again, once, on a new connection: that line promises nothing sent
was run. Any other loss of the connection during a call is an error, never a resend, since the call may
have run. When the channel refuses a request while it is still being sent (`request_too_large`), its
error line is read after the failed send and raised as that error.

A kernel on another machine (a remote gateway's) dials `tls://HOST:PORT` and pins the channel's
certificate, whose PEM it is given in `IPYBOX_TOOL_CERT`: it trusts that certificate alone (no CA, no host
name check: the name it dials inside a cluster need not be the certificate's), and then compares the
SHA-256 of the certificate the channel presented with the pinned one's, so that a certificate merely
signed by the pinned one's key is refused too. Only then is the token sent. `ssl` is imported for a
`tls://` address only.

`reset` is the kernel's session reset: in a workspace it stops the MCP servers this kernel used that no
other kernel uses (shared servers keep running, other kernels' calls are not interrupted); with an
embedded tool server, whose only caller is this kernel, every started server.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import select
import socket
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from ipybox.in_kernel.call_protocol import (
    CERT_ENV,
    CLOSING,
    MAX_CELL_TEXT,
    OP_RESET,
    OP_RUN,
    OP_SHELL,
    SERVER_ENV,
    SHELL_KINDS,
    SHELL_SERVER,
    TOKEN_ENV,
    ErrorKind,
    error_kind,
)

if TYPE_CHECKING:
    import ssl  # imported at run time for `tls://` addresses only

__all__ = [
    "CERT_ENV",
    "SERVER_ENV",
    "SHELL_KINDS",
    "TOKEN_ENV",
    "ApprovalRejectedError",
    "ApprovalTimeoutError",
    "ToolRunner",
    "ToolRunnerError",
    "approve_shell",
    "request_op",
]

# Below the allocator's mmap threshold: every recv() allocates a buffer of this size.
_CHUNK = 64 * 1024
# Seconds a `tls://` connect and handshake may take (a remote host that drops packets must not hang the
# cell); the call itself has no timeout, as on a Unix socket.
_TLS_CONNECT_TIMEOUT = 30.0
_PEM_BEGIN, _PEM_END = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"


class ToolRunnerError(Exception):
    """Raised when a tool call fails: the tool reported an error, the server is unknown or unreachable,
    or the call was not approved."""


class ApprovalRejectedError(ToolRunnerError):
    """Raised when the application (or an approval rule) rejected the tool call.

    Attributes:
        rule_id: The rule that refused the call (or asked, and got no yes), when a rule did: its `id`, or
            `rules[<index>]`.
        tier: The admin tier of that rule (`system`, `user`), `None` for the workspace's `ipybox.toml`.
        reason: That rule's `reason`: why it refuses, and often what is allowed instead.
    """

    def __init__(
        self, message: str, *, rule_id: str | None = None, tier: str | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.rule_id = rule_id
        self.tier = tier
        self.reason = reason


class ApprovalTimeoutError(ToolRunnerError):
    """Raised when nobody decided on the tool call within the approval timeout."""


_ERRORS: dict[ErrorKind | None, type[ToolRunnerError]] = {
    ErrorKind.APPROVAL_REJECTED: ApprovalRejectedError,
    ErrorKind.APPROVAL_TIMEOUT: ApprovalTimeoutError,
}


class _Connection:
    """One connection to the tool server's call channel: a socket and a buffered reader on it."""

    def __init__(self, address: str, timeout: float | None = None, cert: str | None = None) -> None:
        self.address = address
        self.cert = cert
        self.tls = address.startswith("tls://")
        if address.startswith("unix:"):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = address[len("unix:") :]
        elif address.startswith(("tcp://", "tls://")):
            host, _, port = address[len("tcp://") :].rstrip("/").rpartition(":")
            if not host or not port.isdigit():
                raise ToolRunnerError(f"unsupported tool server address {address!r} (expected a HOST:PORT)")
            if self.tls:
                if not cert:
                    raise ToolRunnerError(
                        f"the tool server is at {address}, but {CERT_ENV} is not set: a kernel sends calls "
                        "over TLS only to the certificate it pins, and has none (ipybox sets it when it "
                        "prepares a remote kernel)"
                    )
                pin = _pinned_context(cert)
            self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            target = (host.strip("[]"), int(port))
        else:
            raise ToolRunnerError(
                f"unsupported tool server address {address!r} "
                "(expected 'unix:PATH', 'tcp://HOST:PORT' or 'tls://HOST:PORT')"
            )
        try:
            # Tool calls may wait on a human approval, so there is no socket timeout: the server enforces
            # the approval timeout and always answers. `timeout` bounds the connect only (`request_op`).
            self.sock.settimeout(_TLS_CONNECT_TIMEOUT if self.tls and timeout is None else timeout)
            self.sock.connect(target)
            if self.tls:
                self.sock = _pinned_tls(self.sock, *pin, address)
            self.sock.settimeout(None)
        except OSError as e:
            self.sock.close()
            raise ToolRunnerError(f"cannot reach the ipybox tool server at {address}: {e}") from None
        except BaseException:
            self.sock.close()
            raise

    def exchange(self, line: bytes) -> bytes:
        """Send one request line and return the answer line (without a newline if the server hung up)."""
        try:
            self.sock.sendall(line)
        except OSError:
            # The channel may have refused the request mid-send and closed: its error line was sent first.
            # (Over TLS, a failed send may leave the session unusable: then it is a lost connection.)
            try:
                refusal = self.sock.recv(_CHUNK) if self._readable() else b""
            except OSError:
                refusal = b""
            if refusal.endswith(b"\n"):
                return refusal
            raise
        chunks: list[bytes] = []
        while True:
            chunk = self.sock.recv(_CHUNK)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            # One answer per request, and JSON has no raw newlines: a newline only ends the answer.
            if chunk.endswith(b"\n"):
                return b"".join(chunks)

    def stale(self) -> bool:
        """Whether the server closed this idle connection (it is readable with nothing asked)."""
        if not self._readable():
            return False
        if not self.tls:
            return True
        # The socket may hold TLS records that carry no data (session tickets, a key update): only data (the
        # channel's `idle_timeout` line) or the end of the stream means the channel closed it.
        import ssl  # loaded already: this connection is a TLS one

        sock = self.sock
        previous = sock.gettimeout()
        sock.settimeout(0)
        try:
            sock.recv(1)  # data or b"" (closed): stale either way; the connection is dropped
        except ssl.SSLWantReadError:
            return False
        except OSError:
            pass
        finally:
            sock.settimeout(previous)
        return True

    def _readable(self) -> bool:
        """Whether a read would not block. A TLS socket may hold decrypted bytes the OS no longer sees."""
        if self.tls and self.sock.pending() > 0:  # type: ignore[attr-defined]  # an ssl.SSLSocket
            return True
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable)

    def close(self) -> None:
        self.sock.close()


class _Connections(threading.local):
    conn: _Connection | None = None


_local = _Connections()


class ToolRunner:
    """Runs the tools of one MCP server on the tool server.

    Generated modules under `mcptools/` create one of these per call; it is cheap, since connections are
    shared per thread.

    Args:
        server_name: Name of the MCP server, as registered on the host.
        server_params: Accepted for compatibility with ipybox 0.9 and ignored: the host alone decides how
            a server is started, so code in the kernel cannot make it start a process of its choosing.
        host: With `port`: the loopback host of the tool server's call channel (ipybox 0.9 compatibility).
        port: The port of the tool server's call channel
            ([ToolServer.calls_address][ipybox.tool_server.tool_server.ToolServer.calls_address]).
        address: Call channel address (`unix:/path`, `tcp://127.0.0.1:PORT`, or `tls://HOST:PORT` for a
            remote kernel); defaults to the `IPYBOX_TOOL_SERVER` environment variable set by ipybox.
        token: A call token (`ToolServer.call_token` or one from `ToolServer.add_caller`); defaults to
            `IPYBOX_TOOL_TOKEN`.
        cert: For a `tls://` address: the PEM of the certificate the channel must present
            ([ToolServer.remote_certificate_pem][ipybox.tool_server.tool_server.ToolServer.remote_certificate_pem]);
            defaults to `IPYBOX_TOOL_CERT`.
        package: The absolute path of the directory the calling module's package was generated into
            (generated modules pass their own): the host finds `server_name` among the servers generated
            there, so the package works from wherever it is. A location, never parameters: the host uses it
            only for roots it generated into itself. `None`: the name alone, as in ipybox 0.9.

    Example:
        ```python
        runner = ToolRunner("filesystem")
        listing = runner.run_sync("list_directory", {"path": "."})
        ```
    """

    def __init__(
        self,
        server_name: str,
        server_params: dict[str, Any] | None = None,
        host: str | None = None,
        port: int | None = None,
        *,
        address: str | None = None,
        token: str | None = None,
        package: str | None = None,
        cert: str | None = None,
    ) -> None:
        self.server_name = server_name
        self.package = package
        if address is None and port is not None:
            address = f"tcp://{'127.0.0.1' if host in (None, 'localhost') else host}:{port}"
        self._address = address
        self._token = token
        self._cert = cert

    def run_sync(self, tool_name: str, tool_args: dict[str, Any]) -> dict[str, Any] | str | None:
        """Run a tool and return its result: structured content as a dict, else text.

        Raises:
            ApprovalRejectedError: The call was rejected.
            ApprovalTimeoutError: Nobody decided in time.
            ToolRunnerError: The tool failed, or the tool server could not be reached.
        """
        request: dict[str, Any] = {
            "op": OP_RUN,
            "server": self.server_name,
            "tool": tool_name,
            "args": tool_args,
        }
        if self.package is not None:
            request["package"] = self.package
        cell, code = _cell()
        if cell is not None:
            request["cell"] = cell
            request.update(_cell_context())
        if code is not None:
            request["code"] = code
        answer = self._request(request)
        result: dict[str, Any] | str | None = answer.get("result")
        return result

    async def run(self, tool_name: str, tool_args: dict[str, Any]) -> dict[str, Any] | str | None:
        """Async variant of [run_sync][ipybox.in_kernel.tool_runner.ToolRunner.run_sync]."""
        return await asyncio.to_thread(self.run_sync, tool_name, tool_args)

    def reset_sync(self) -> None:
        """Reset this kernel's MCP servers (they start again on their next call): in a workspace, those
        this kernel used that no other kernel uses (shared ones keep running); with an embedded tool
        server, every started server."""
        self._request({"op": OP_RESET})

    async def reset(self) -> None:
        """Async variant of [reset_sync][ipybox.in_kernel.tool_runner.ToolRunner.reset_sync]."""
        await asyncio.to_thread(self.reset_sync)

    def _request(self, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        address = self._address or os.environ.get(SERVER_ENV)
        if not address:
            raise ToolRunnerError(
                f"no tool server is configured ({SERVER_ENV} is not set): run this code through an "
                "ipybox CodeExecutor or a running ipybox workspace"
            )
        # The token first: the channel charges a large request to its caller from its first bytes.
        request = {"token": self._token or os.environ.get(TOKEN_ENV, ""), **request}
        try:
            line = json.dumps(request, separators=(",", ":")).encode() + b"\n"
        except (TypeError, ValueError) as e:
            raise ToolRunnerError(f"tool arguments must be JSON-serializable: {e}") from None
        cert = (self._cert or os.environ.get(CERT_ENV)) if address.startswith("tls://") else None
        answer = _exchange(address, line, timeout, cert)
        if "error" in answer:
            error = answer["error"]
            kind = _ERRORS.get(error_kind(answer), ToolRunnerError)
            message = error.get("message", "tool call failed")
            if kind is ApprovalRejectedError:
                raise ApprovalRejectedError(
                    message,
                    rule_id=_text(error, "rule"),
                    tier=_text(error, "tier"),
                    reason=_text(error, "why"),
                )
            raise kind(message)
        return answer


def _text(error: dict[str, Any], key: str) -> str | None:
    value = error.get(key)
    return value if isinstance(value, str) else None


_cell_seen: tuple[int, str | None] | None = None  # (cell number, digest of its text), hashed once a cell
_cell_text: str | None = None  # the text of the cell `_cell_seen` names
_shell: Any = None  # IPython's shell, found once: looking it up took 5 us a call


def _cell() -> tuple[int | None, str | None]:
    """The number of the cell running now (IPython's `execution_count` while it runs) and the SHA-256 of
    its text, for a rule's per-cell quota and the audit log; `(None, None)` outside IPython. Never imports
    IPython: a kernel has it loaded already."""
    global _cell_seen, _cell_text, _shell
    if _shell is None:
        ipython = sys.modules.get("IPython")
        _shell = ipython.get_ipython() if ipython is not None else None
        if _shell is None:
            return None, None
        # From now on, the traceback of a call that fails ends at the caller's line, not in ipybox's code.
        from ipybox.in_kernel.tool_tracebacks import install

        install(_shell)
    count = getattr(_shell, "execution_count", None)
    if not isinstance(count, int) or isinstance(count, bool):
        return None, None
    if _cell_seen is None or _cell_seen[0] != count:
        digest = text = None
        try:  # the running cell is the last input IPython stored (before it ran it)
            text = _shell.history_manager.input_hist_raw[-1]
            if isinstance(text, str):
                digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        except (AttributeError, IndexError):
            pass
        _cell_seen = (count, digest)
        _cell_text = text if isinstance(text, str) else None
    return _cell_seen


_FRAMES_LOOKED_AT = 64  # frames walked up from a call to find its cell's (measured: ~3 us for a direct call)


_text_sent: tuple[str | None, int, int] | None = None  # (code, first, last line) of the cell text sent last


def _cell_context() -> dict[str, Any]:
    """What a call's request says of its cell's code, for the people asked about it (see
    `call_protocol`): the line the call was made on, if this thread's stack passes through the cell
    (a call run in another thread, as `arun()` does, has no line), and the cell's text, whole up to
    `MAX_CELL_TEXT` characters, else the lines around the call that fit.

    The text goes with a cell's first call only (and, for a long cell, again when a call's line is outside
    the lines sent): the tool server keeps the last text of each kernel for its later calls of the same
    cell. Sending it with every call cost 0.1-0.7 ms a call for 2-8 KB cells (JSON on both ends)."""
    global _text_sent
    context: dict[str, Any] = {}
    line = _call_line()
    if line is not None:
        context["line"] = line
    text = _cell_text
    if text is None or _cell_seen is None:
        return context
    code = _cell_seen[1]
    if len(text) <= MAX_CELL_TEXT:
        if _text_sent != (code, 1, -1):
            context["cell_text"] = text
            _text_sent = (code, 1, -1)
        return context
    if line is None:
        return context  # a long cell and no line to centre on: nothing worth sending
    if _text_sent is not None and _text_sent[0] == code and _text_sent[1] <= line <= _text_sent[2]:
        return context
    first, part = cell_window_text(text, line, MAX_CELL_TEXT)
    context["cell_text"] = part
    context["cell_text_from"] = first
    _text_sent = (code, first, first + part.count("\n"))
    return context


def cell_window_text(text: str, line: int, limit: int) -> tuple[int, str]:
    """The lines of `text` around `line` (1-based) that fit in `limit` characters (newlines included),
    taken alternately after and before it, and the number of the first: `(first, text)`. A call line
    longer than `limit` is cut."""
    lines = text.split("\n")
    index = min(max(line, 1), len(lines)) - 1
    low = high = index
    size = len(lines[index])
    while True:
        grown = False
        if high + 1 < len(lines) and size + 1 + len(lines[high + 1]) <= limit:
            high += 1
            size += 1 + len(lines[high])
            grown = True
        if low > 0 and size + 1 + len(lines[low - 1]) <= limit:
            low -= 1
            size += 1 + len(lines[low])
            grown = True
        if not grown:
            break
    return low + 1, "\n".join(lines[low : high + 1])[:limit]


def _call_line() -> int | None:
    """The line of the running cell this thread's stack is on (the innermost frame of the cell's code);
    `None` when the stack does not pass through it (a thread a previous cell started, asyncio's worker
    thread of `arun()`). The running cell's file is the last IPython's compiler named (`_filename_map`, in
    the order cells were compiled: its numbers lag `execution_count` by one in IPython 9)."""
    names = getattr(getattr(_shell, "compile", None), "_filename_map", None)
    if not isinstance(names, dict) or not names:
        return None
    current = next(reversed(names))
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_FRAMES_LOOKED_AT):
        if frame is None:
            return None
        if frame.f_code.co_filename == current:
            return frame.f_lineno
        frame = frame.f_back
    return None


def approve_shell(
    kind: str, cmd: str, magic: str | None = None, *, address: str | None = None, token: str | None = None
) -> None:
    """Ask the tool server whether a shell command may run in this kernel; return only if it may.

    Nothing runs on the host: the tool server only decides, as it decides a tool call of `ipybox.<kind>`
    with arguments `{"cmd": cmd}` (plus `"magic"` when given). The command runs in the kernel afterwards.

    Args:
        kind: `"shell"` (`!cmd`, `!!cmd`, `x = !cmd`) or `"shell_magic"` (a cell magic such as `%%bash`).
        cmd: The command exactly as it will run (variables already expanded), or the cell of a magic.
        magic: For a cell magic other than `%%bash`/`%%sh`: its name and line (e.g. `"perl -w"`).
        address: Call channel address; defaults to `IPYBOX_TOOL_SERVER`.
        token: Call token; defaults to `IPYBOX_TOOL_TOKEN`.

    Raises:
        ApprovalRejectedError: The command was rejected.
        ApprovalTimeoutError: Nobody decided in time.
        ToolRunnerError: The tool server could not be reached or refused the request.
    """
    if kind not in SHELL_KINDS:
        raise ValueError(f"kind must be one of {SHELL_KINDS}, not {kind!r}")
    request: dict[str, Any] = {"op": OP_SHELL, "kind": kind, "cmd": cmd}
    if magic is not None:
        request["magic"] = magic
    answer = ToolRunner(SHELL_SERVER, address=address, token=token)._request(request)
    if answer.get("approved") is not True:
        raise ToolRunnerError(f"unexpected answer from the tool server to a shell approval: {answer!r}")


def request_op(
    op: str,
    fields: dict[str, Any] | None = None,
    *,
    timeout: float | None = None,
    address: str | None = None,
    token: str | None = None,
) -> dict[str, Any]:
    """Send one request of `op` (with `fields`) on this thread's connection and return its answer.

    For the quick ops that serve modules to kernels without the host's files (`source`, `generation`):
    `timeout` bounds the connect and the wait for the answer (a call channel that went away is an error
    after `timeout` seconds, not a hang); the connection is closed after a timeout, since its answer may
    still come.

    Raises:
        ToolRunnerError: The channel answered an error (its message), or could not be reached in time.
    """
    request = {"op": op, **(fields or {})}
    return ToolRunner("", address=address, token=token)._request(request, timeout)


def _exchange(
    address: str, line: bytes, timeout: float | None = None, cert: str | None = None
) -> dict[str, Any]:
    answer = _exchange_once(address, line, timeout, cert)
    if error_kind(answer) is ErrorKind.IDLE_TIMEOUT:
        # The channel closed this idle connection as the request crossed it, and ran none of it.
        answer = _exchange_once(address, line, timeout, cert)
    return answer


def _exchange_once(
    address: str, line: bytes, timeout: float | None = None, cert: str | None = None
) -> dict[str, Any]:
    conn = _local.conn
    if conn is not None and (conn.address != address or conn.cert != cert or conn.stale()):
        # A restarted tool server closed it while idle: reconnecting is safe, nothing was sent yet.
        conn.close()
        conn = _local.conn = None
    if conn is None:
        conn = _local.conn = _Connection(address, timeout, cert)
    try:
        if timeout is not None:
            conn.sock.settimeout(timeout)
        reply = conn.exchange(line)
        if timeout is not None:
            conn.sock.settimeout(None)  # the next tool call may wait on an approval
    except BaseException as e:
        # Interrupted (KeyboardInterrupt) or broken mid-call: the answer may still arrive later and
        # must not be read as the answer to the next call.
        conn.close()
        _local.conn = None
        if isinstance(e, OSError):
            raise ToolRunnerError(f"lost the connection to the ipybox tool server: {e}") from None
        raise
    if not reply.endswith(b"\n"):
        conn.close()
        _local.conn = None
        raise ToolRunnerError("the ipybox tool server closed the connection during the call")
    try:
        answer: dict[str, Any] = json.loads(reply)
    except ValueError:
        raise ToolRunnerError(f"unexpected answer from the tool server: {reply[:200]!r}") from None
    if error_kind(answer) in CLOSING:
        conn.close()
        _local.conn = None
    return answer


# -- pinning the channel's certificate (`tls://` addresses)

_contexts: dict[str, tuple[ssl.SSLContext, bytes]] = {}  # pinned PEM -> (its ssl.SSLContext, its SHA-256)


def _pinned_tls(sock: socket.socket, context: ssl.SSLContext, pinned: bytes, address: str) -> socket.socket:
    """`sock`, connected, as a TLS client (`context`) of the channel, which presented exactly the
    certificate whose SHA-256 is `pinned`.

    Raises:
        ToolRunnerError: The channel presented another certificate.
        OSError: The handshake failed otherwise (the caller reports the channel unreachable).
    """
    import hashlib
    import ssl  # at run time (the module imports it for type checking only)

    try:
        tls = context.wrap_socket(sock)
    except ssl.SSLCertVerificationError as e:
        raise ToolRunnerError(
            f"the ipybox tool server at {address} did not present the certificate this kernel pins "
            f"({CERT_ENV}): {e.verify_message}; nothing was sent to it"
        ) from None
    der = tls.getpeercert(binary_form=True) or b""
    if hashlib.sha256(der).digest() != pinned:
        # Trusted by the context (e.g. signed by the pinned certificate's key) but not the one pinned.
        tls.close()
        raise ToolRunnerError(
            f"the ipybox tool server at {address} presented a certificate other than the one this kernel "
            f"pins ({CERT_ENV}: SHA-256 {pinned.hex()[:16]}..., presented {hashlib.sha256(der).hexdigest()[:16]}"
            "...); nothing was sent to it"
        )
    return tls


def _pinned_context(pem: str) -> tuple[ssl.SSLContext, bytes]:
    """The client context that trusts the certificate `pem` alone, and that certificate's SHA-256.

    Raises:
        ToolRunnerError: `pem` holds no certificate.
    """
    cached = _contexts.get(pem)
    if cached is not None:
        return cached
    import hashlib
    import ssl

    start, end = pem.find(_PEM_BEGIN), pem.find(_PEM_END)
    try:
        if start < 0 or end < start:
            raise ValueError("no '-----BEGIN CERTIFICATE-----' block")
        first = pem[start : end + len(_PEM_END)]  # the pinned certificate; a chain after it is not pinned
        pinned = hashlib.sha256(ssl.PEM_cert_to_DER_cert(first)).digest()
        context = ssl.create_default_context(cadata=first)
    except (ValueError, ssl.SSLError) as e:
        raise ToolRunnerError(f"{CERT_ENV} does not hold a PEM certificate: {e}") from None
    # The name dialed inside a cluster need not be the certificate's: the pin is the check.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    # A CA-issued certificate is trusted alone, without its CA (OpenSSL wants a self-signed root else).
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _contexts[pem] = context, pinned
    return context, pinned
