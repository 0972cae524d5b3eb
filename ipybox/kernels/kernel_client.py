"""`KernelClient`: stateful code execution in an IPython kernel on a kernel gateway.

A kernel that dies under an execution (its process exited, or its gateway went away: the websocket
closes at once, also on SIGKILL) fails that execution with `KernelDiedError`, once a fresh kernel replaced
it or could not. Its message names the cause: the process, or the gateway, with how the gateway ended when
the `gateway_loss` hook knows (a workspace's supervisor, which restarted it; an embedded gateway's exit
status) and the refused connection otherwise; never an empty message.

Ending an execution early:

- timeout (`timeout=None`: no limit; time paused through `timer` does not count): the code is interrupted;
  if it does not stop within `interrupt_grace` the kernel is replaced. `ExecutionTimeoutError` says so after
  ipybox 0.9.2's sentence ("Code execution exceeded timeout of 0.20s (approval wait excluded).").
- cancellation (`cancel()`, or the `Cancellation` passed to `stream`): the code is interrupted once it has
  started (the kernel's `execute_input`: an interrupt that lands before is ignored), again after a second
  if it swallowed that, and the stream ends with the output so far as a result with `cancelled=True`;
  whatever the interrupted code raises is not raised. Code that still runs after `interrupt_grace` gets
  the timeout's treatment: the kernel is replaced (a warning is logged; its state is lost).

Background work (starting the spare kernel, shutting down a replaced one) belongs to a task group the
client holds from `connect()` to `disconnect()` (a `Service` of `ipybox.lifecycle`); `disconnect()` waits
for the replaced kernels' shutdowns, then closes the group. A caller cancelled meanwhile sees its
`CancelledError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from ipybox.errors import KernelError
from ipybox.kernels.gateway import GatewayEndpoint
from ipybox.kernels.kernel_connection import (
    GatewayError,
    GatewayUnreachableError,
    KernelConnection,
    KernelDied,
    KernelMessage,
    KernelStartError,
    Request,
    gateway_down,
)
from ipybox.kernels.output import OutputCollector, strip_ansi
from ipybox.kernels.result import (
    CodeExecutionChunk,
    CodeExecutionError,
    CodeExecutionResult,
    KernelDiedError,
    ResourceLimitError,
    StreamName,
)
from ipybox.kernels.timer import Cancellation, ExecutionTimer
from ipybox.kernels.warm_up import warm_up as warm_up_kernel
from ipybox.lifecycle import Service, cancel_and_wait
from ipybox.limits import format_bytes
from ipybox.safefs import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_OUTPUT_FILE_BYTES

if TYPE_CHECKING:
    # aiohttp is imported where it is used, not here: it is a third of what `from ipybox import
    # CodeExecutor` would load, and no request goes to a gateway before `connect()`.
    import aiohttp

__all__ = [
    "Cancellation",
    "CodeExecutionChunk",
    "CodeExecutionError",
    "CodeExecutionResult",
    "ExecutionError",
    "ExecutionResult",
    "ExecutionTimeoutError",
    "GatewayUnreachableError",
    "KernelClient",
    "KernelDiedError",
    "KernelStartError",
    "ResourceLimitError",
]

logger = logging.getLogger(__name__)

# Names of ipybox 0.9's kernel client module.
ExecutionResult = CodeExecutionResult
ExecutionError = CodeExecutionError

DEFAULT_MAX_OUTPUT_CHARS = 4_000_000

_WAKE = KernelMessage("", "__ipybox_cancel__", {})
"""Put on a running request's queue by a cancellation, to wake the execution waiting for the kernel (a
message type no kernel sends, so `_handle` ignores it)."""

_REINTERRUPT = 1.0
"""Seconds after which a cancelled execution that still runs is interrupted again (it swallowed the
interrupt). Not much sooner: an interrupt that lands while IPython shows the traceback of the previous one
prints a stray "KeyboardInterrupt" into the output."""


class ExecutionTimeoutError(KernelError, TimeoutError):
    """An execution ran past its timeout.

    Attributes:
        kernel_restarted: `False` when the interrupt stopped the code and the kernel kept its state; `True`
            when the code ignored the interrupt and the kernel had to be replaced (its state is lost).
        result: The output produced before the timeout.
    """

    def __init__(self, message: str, *, kernel_restarted: bool, result: CodeExecutionResult) -> None:
        super().__init__(message)
        self.kernel_restarted = kernel_restarted
        self.result = result


class KernelClient:
    """Executes code in an IPython kernel on a kernel gateway; state persists across executions.

    Executions on one client run one at a time, in call order. Output is complete: the client waits for
    both the kernel's reply and its idle status. A warm spare kernel (on by default) makes `reset()` and
    recovery from a dead or stuck kernel a swap instead of a kernel start.

    Args:
        gateway: The gateway's endpoint, or (as in ipybox 0.9) its host name, with `port` and `token`.
        port: The gateway's port, when `gateway` is a host name.
        token: The gateway's auth token, when `gateway` is a host name.
        images_dir: Where displayed images are saved (default: `images` in the working directory).
        output_dir: Where an output larger than `max_output_chars` is saved in full (default: a private
            directory of this process under `$TMPDIR`, mode 0700).
        max_output_chars: Output kept in memory per execution; more is saved to a file and shortened (to
            its first and last `max_output_chars // 2` characters around a notice).
        keep_output_tail: `False`: a shortened output keeps its first `max_output_chars` characters only,
            as ipybox 0.9.2's MCP server did (its `execute_ipython_cell` sets it).
        max_output_file_bytes: Bytes of an execution's complete output saved to that file, and of the
            images it displays together; past it nothing more is written, and the output says so.
        max_image_bytes: The largest image saved; a larger one is not, and the output says so.
        kernel_name: Kernelspec to start (default: the gateway's default).
        kernel_env: Environment for kernels, sent with the kernel start request. An external gateway passes
            only variables named `KERNEL_*` or whitelisted in its `env_whitelist`.
        spare_kernel: Keep a started kernel in reserve for fast `reset()` and recovery.
        interrupt_grace: Seconds a timed-out execution gets to stop after an interrupt before the kernel is
            replaced.
        ready_timeout: Seconds a new kernel gets to answer (ipybox 0.9's `kernel_init_timeout`; `None`: no
            limit). A kernel that dies while starting fails at once (`KernelStartError`), without waiting for
            this.
        kernel_source: Where kernels come from instead of being started on the gateway: returns the id of
            a running kernel to attach to (a workspace's warm pool). Waiting for it counts against
            `ready_timeout`, unless `source_wait_bounded` is `False`.
        source_wait_bounded: Whether `ready_timeout` bounds the wait for `kernel_source` too. `False` for
            a source that bounds its own wait (a remote gateway's kernels: a workspace gives a pod its
            `[kernel.gateway] start_timeout`, minutes by default).
        gateway_log: The gateway's log file (`KernelGateway.log_path`), whose end is added to the error
            about a kernel that died while starting (the kernel's own error output goes there).
        gateway_loss: Says what became of the gateway, as a clause about it ("it exited with signal 9
            (SIGKILL) and ipybox restarted it"), after a running kernel's connection closed and the gateway
            did not answer; asked once the kernel was replaced, for `KernelDiedError`'s message. Whoever
            runs the gateway knows; the client sees only a refused connection.
        warm_up: Warm the spare kernel up once it answers (`ipybox.kernels.warm_up`: what the first tool
            call in it needs is imported), for kernels of ipybox's own kernel spec. Taking the spare stops
            its warm-up after the step in progress.
        set_up: Called with each kernel this client opens (the first, the spare, a replacement) once it
            answers, before it is used or warmed up (a remote kernel's set-up: `ipybox.kernels.remote_setup`).
            A kernel whose set-up raises is deleted, and the error is raised (fail closed).

    Example:
        ```python
        async with KernelGateway() as gateway, KernelClient(gateway.endpoint) as client:
            await client.execute("x = 2")
            assert (await client.execute("print(x ** 10)")).text == "1024"
        ```
    """

    def __init__(
        self,
        gateway: GatewayEndpoint | str = "localhost",
        port: int = 8888,
        *,
        token: str = "",
        images_dir: Path | None = None,
        output_dir: Path | None = None,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_output_file_bytes: int = DEFAULT_MAX_OUTPUT_FILE_BYTES,
        max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
        keep_output_tail: bool = True,
        kernel_name: str | None = None,
        kernel_env: dict[str, str] | None = None,
        spare_kernel: bool = True,
        interrupt_grace: float = 2.0,
        ready_timeout: float | None = 60,
        kernel_source: Callable[[], Awaitable[str]] | None = None,
        source_wait_bounded: bool = True,
        gateway_log: Path | None = None,
        gateway_loss: Callable[[], Awaitable[str | None]] | None = None,
        warm_up: bool = False,
        set_up: Callable[[KernelConnection], Awaitable[None]] | None = None,
    ) -> None:
        if isinstance(gateway, str):
            gateway = GatewayEndpoint(f"http://{gateway}:{port}", token)
        self.endpoint = gateway
        self.images_dir = images_dir or Path("images")
        self.output_dir = output_dir  # None: a private per-process directory (see `output`)
        self.max_output_chars = max_output_chars
        self.max_output_file_bytes = max_output_file_bytes
        self.max_image_bytes = max_image_bytes
        self.keep_output_tail = keep_output_tail
        self.kernel_name = kernel_name
        self.kernel_env = kernel_env
        self.spare_kernel = spare_kernel
        self.interrupt_grace = interrupt_grace
        self.ready_timeout = ready_timeout
        self.source_wait_bounded = source_wait_bounded
        self.kernel_source = kernel_source
        self.gateway_log = gateway_log
        self.gateway_loss = gateway_loss
        self.warm_up = warm_up
        self.set_up = set_up
        self._spare_deaths = 0  # spares that died while idle since one was last taken into use
        self._http: aiohttp.ClientSession | None = None
        self._kernel: KernelConnection | None = None
        self._tasks: Service | None = None  # the background work's group, while connected
        self._spare: asyncio.Task[KernelConnection | None] | None = None  # None: it failed to start (logged)
        self._retiring: set[asyncio.Task[None]] = set()  # shutdowns of replaced kernels, in `_tasks`
        self._lock = asyncio.Lock()
        self._timer: ExecutionTimer | None = None
        self._cancellation: Cancellation | None = None  # the running execution's

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.disconnect()

    @property
    def kernel_id(self) -> str:
        """The ID of the current kernel. Raises RuntimeError when not connected."""
        if self._kernel is None:
            raise RuntimeError("not connected to a kernel")
        return self._kernel.kernel_id

    @property
    def timer(self) -> ExecutionTimer | None:
        """The running execution's timer (to pause it while the execution waits on something else)."""
        return self._timer

    async def connect(self, *, kernel_init_timeout: float | None = None) -> None:
        """Start a kernel and connect to it (and start the spare in the background).

        Args:
            kernel_init_timeout: Seconds this kernel gets to answer, instead of `ready_timeout` (as in
                ipybox 0.9.2, `None` means `ready_timeout`).

        Raises:
            GatewayUnreachableError: The gateway does not accept connections.
            KernelStartError: The kernel died while starting.
            TimeoutError: It was alive but did not answer in time (the message names `kernel_init_timeout`).
        """

        if self._http is not None:
            raise RuntimeError("already connected")
        self._http = self.endpoint.session()
        self._tasks = Service("kernel client")
        try:
            await self._tasks.start()
            ready = self.ready_timeout if kernel_init_timeout is None else kernel_init_timeout
            self._kernel = await self._open_kernel(ready)
        except BaseException:
            await self.disconnect()
            raise
        self._start_spare()

    async def disconnect(self, shutdown_kernels: bool = True) -> None:
        """Shut down this client's kernels and close its connections.

        Args:
            shutdown_kernels: Delete the kernels on the gateway. Pass `False` when the gateway itself is about
                to stop (it ends all its kernels at once, which is faster than one by one).

        Raises:
            CancelledError: The caller was cancelled (the client's background work and connections are
                closed even so; a kernel whose shutdown was cancelled may be left on the gateway).
        """
        kernels: list[KernelConnection] = []
        if self._kernel is not None:
            kernels.append(self._kernel)
            self._kernel = None
        done = False
        try:
            if self._spare is not None:
                spare, self._spare = self._spare, None
                # A spare still starting deletes its kernel when cancelled; one that started is shut down.
                await cancel_and_wait(spare)
                if not spare.cancelled() and spare.exception() is None and (kernel := spare.result()):
                    kernels.append(kernel)
            await asyncio.gather(
                *(k.shutdown(delete=shutdown_kernels) for k in kernels),
                *self._retiring,
                return_exceptions=True,
            )
            done = True
        finally:
            if not done:  # cancelled: at least their websockets and tasks end (not deleted: no request)
                for kernel in kernels:
                    await kernel.shutdown(delete=False)
            tasks, self._tasks = self._tasks, None
            if tasks is not None:
                await tasks.aclose()
            if self._http is not None:
                await self._http.close()
                self._http = None

    async def _open_kernel(self, ready_timeout: float | None) -> KernelConnection:
        """A new kernel that answered within `ready_timeout` seconds (`None`: no limit), set up by `set_up`.

        Raises:
            GatewayUnreachableError: The gateway does not accept connections.
            KernelStartError: The kernel died while starting (or, from `set_up`, could not be set up).
            TimeoutError: It was alive but did not answer within `ready_timeout`.
        """
        kernel = await self._start_kernel(ready_timeout)
        if self.set_up is not None:
            try:
                await self.set_up(kernel)
            except BaseException:
                await kernel.shutdown()  # never used half set up (fail closed)
                raise
        return kernel

    async def _start_kernel(self, ready_timeout: float | None) -> KernelConnection:
        import aiohttp

        assert self._http is not None
        try:
            if self.kernel_source is not None:
                # The wait for the source's kernel counts too (a workspace's pool may have none ready and
                # start one): `ready_timeout` bounds the time until a kernel answers, as 0.9.2's
                # kernel_init_timeout bounded a start. A kernel the source handed out meanwhile is its to
                # take back (a workspace deletes it with the lease, which the caller then gives back).
                loop = asyncio.get_running_loop()
                started = loop.time()
                async with asyncio.timeout(ready_timeout if self.source_wait_bounded else None):
                    kernel_id = await self.kernel_source()
                left = ready_timeout
                if ready_timeout is not None and self.source_wait_bounded:
                    left = max(0.0, ready_timeout - (loop.time() - started))
                return await KernelConnection.attach(
                    self._http,
                    self.endpoint,
                    kernel_id,
                    ready_timeout=left,
                    gateway_log=self.gateway_log,
                )
            return await KernelConnection.open(
                self._http,
                self.endpoint,
                kernel_name=self.kernel_name,
                env=self.kernel_env,
                ready_timeout=ready_timeout,
                gateway_log=self.gateway_log,
            )
        except aiohttp.ClientConnectionError as e:
            raise GatewayUnreachableError(
                f"cannot reach the kernel gateway at {self.endpoint.url}: {e}"
            ) from None
        except TimeoutError:
            limit = f"{ready_timeout:g} s" if ready_timeout is not None else "the time it was given"
            raise TimeoutError(
                f"the kernel did not become ready within {limit} (kernel_init_timeout): raise "
                "kernel_init_timeout (None: no limit) if kernels start slowly here, e.g. on a busy machine"
            ) from None

    def _start_spare(self) -> None:
        tasks = self._tasks
        if self.spare_kernel and self._spare is None and tasks is not None and tasks.running:
            self._spare = tasks.spawn(self._open_spare(), name="ipybox-spare-kernel")

    async def _open_spare(self) -> KernelConnection | None:
        try:
            kernel = await self._open_kernel(self.ready_timeout)
        except Exception as e:
            # Not a failure of the client's background work: the next kernel needed is started then.
            logger.warning("the spare kernel failed to start (%s); the next kernel is started when needed", e)
            return None
        kernel.on_death(self._spare_died)
        if self.warm_up:
            this = asyncio.current_task()
            try:
                # Until the spare is taken (`_fresh_kernel` clears `_spare`): the taker waits for one step.
                await warm_up_kernel(kernel, lambda: self._spare is this)
            except BaseException:  # cancelled (disconnecting): the kernel goes too
                await kernel.shutdown()
                raise
        return kernel

    def _spare_died(self, kernel: KernelConnection) -> None:
        """A ready spare died while idle: start its replacement now rather than at the next `reset()`."""
        spare = self._spare
        if spare is None or not spare.done() or spare.cancelled() or spare.exception() is not None:
            return
        if spare.result() is not kernel:
            return  # taken into use since: its death is the execution's business
        self._spare = None
        self._retire(kernel)
        if kernel.death_cause == "connection":
            return  # the gateway went away (or deleted it): the next kernel is started when needed
        self._spare_deaths += 1
        if self._spare_deaths > 3:  # a kernel that keeps dying: start one only when one is needed
            logger.warning("the spare kernel died %d times in a row; not replacing it", self._spare_deaths)
            return
        logger.warning("the spare kernel died (%s); starting another", _death_text(kernel))
        self._start_spare()

    async def _fresh_kernel(self) -> KernelConnection:
        spare, self._spare = self._spare, None
        kernel: KernelConnection | None = None
        if spare is not None:
            kernel = await spare  # None: it failed to start (logged then)
            if kernel is not None and kernel.dead:
                self._retire(kernel)
                kernel = None
            elif kernel is not None:
                self._spare_deaths = 0
        if kernel is None:
            kernel = await self._open_kernel(self.ready_timeout)
        self._start_spare()
        return kernel

    def _retire(self, kernel: KernelConnection) -> None:
        """Shut `kernel` down in the background (`disconnect()` waits for it)."""
        tasks = self._tasks
        if tasks is None or not tasks.running:
            # Disconnecting (or disconnected): the session the shutdown would use is closing.
            logger.debug("kernel %s replaced while disconnecting: left to the gateway", kernel.kernel_id)
            return
        task = tasks.spawn(kernel.shutdown(), name="ipybox-retire-kernel")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _replace_kernel(self) -> None:
        old, self._kernel = self._kernel, None
        if old is not None:
            self._retire(old)
        self._kernel = await self._fresh_kernel()

    async def reset(self) -> None:
        """Replace the kernel with a fresh one: all variables, imports and definitions are gone."""
        async with self._lock:
            await self._replace_kernel()

    def cancel(self) -> bool:
        """Stop the running execution: its `stream()` ends with the output so far as a result with
        `cancelled=True` instead of an error (see the module's docstring). Safe from any task on the loop.

        Returns:
            Whether an execution was running (without one, this does nothing).
        """
        cancellation = self._cancellation
        if cancellation is None:
            return False
        cancellation.cancel()
        return True

    async def interrupt(self) -> None:
        """Interrupt the running execution (it fails with KeyboardInterrupt)."""
        if self._kernel is not None:
            await self._kernel.interrupt()

    async def interrupt_until_idle(self, timeout: float = 10) -> bool:
        """Interrupt the kernel until it is free for the next execution, e.g. after the caller gave up on one.

        An interrupt that lands before the code starts (or between two statements that swallow it) is
        lost, so this repeats it until the kernel answers a `kernel_info_request`, which it does only once
        the running code has stopped.

        Returns:
            Whether the kernel became free within `timeout` seconds.
        """
        import aiohttp

        kernel = self._kernel
        if kernel is None or kernel.dead:
            return True
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(GatewayError, aiohttp.ClientError):
                await kernel.interrupt()
            try:
                await kernel.request("kernel_info_request", {}, channel="shell", timeout=0.5)
                return True
            except TimeoutError:
                continue
            except KernelDied:
                return True  # the next execution starts a fresh kernel
        return False

    async def execute(self, code: str, timeout: float | None = 120) -> CodeExecutionResult:
        """Execute code and return its result.

        Raises:
            CodeExecutionError: The code raised an exception (`str(e)` is the traceback).
            KernelDiedError: The kernel died; it was replaced by a fresh one.
            ExecutionTimeoutError: The code ran past `timeout` (a `TimeoutError`).
        """
        result: CodeExecutionResult | None = None
        async for item in self.stream(code, timeout):
            if isinstance(item, CodeExecutionResult):
                result = item
        assert result is not None
        return result

    async def stream(
        self, code: str, timeout: float | None = 120, *, cancellation: Cancellation | None = None
    ) -> AsyncIterator[CodeExecutionChunk | CodeExecutionResult]:
        """Execute code, yielding output chunks as they arrive and the result last.

        Args:
            code: The code.
            timeout: Seconds it may run (`None`: no limit).
            cancellation: Stops it when cancelled (`cancel()` does the same for the running execution);
                one cancelled before the execution's turn comes ends it before the code is sent.

        Raises:
            CodeExecutionError: The code raised an exception (not when cancelled).
            KernelDiedError: The kernel died; it was replaced by a fresh one.
            ExecutionTimeoutError: The code ran past `timeout`.
        """
        async with self._lock:
            if self._http is None:
                raise RuntimeError("not connected: use 'async with KernelClient(...)' or call connect()")
            cancellation = cancellation or Cancellation()
            if cancellation.cancelled:
                yield CodeExecutionResult(None, cancelled=True)
                return
            self._cancellation = cancellation
            try:
                if self._kernel is None or self._kernel.dead:
                    dead = self._kernel
                    down = await self._gateway_down(dead) if dead is not None else None
                    await self._replace_kernel()
                    if dead is not None:
                        logger.warning(
                            "the kernel died while idle (%s); continuing on a fresh kernel (its state is lost)",
                            await self._death_cause(dead, down),
                        )
                assert self._kernel is not None
                kernel = self._kernel
                collector = OutputCollector(
                    self.max_output_chars,
                    self.images_dir,
                    self.output_dir,
                    max_file_bytes=self.max_output_file_bytes,
                    max_image_bytes=self.max_image_bytes,
                    keep_tail=self.keep_output_tail,
                )
                timer = self._timer = ExecutionTimer(timeout)
                try:
                    request = kernel.execute(code)
                except KernelDied:
                    await self._replace_kernel()
                    request = (kernel := self._kernel).execute(code)
                error: dict[str, Any] | None = None
                cancelled = started = False
                running = request  # the one a cancellation wakes (its queue is where this waits)
                cancellation.on_cancel(lambda: running.queue.put_nowait(_WAKE))
                try:
                    while not request.done:
                        if cancellation.cancelled:
                            cancelled = True
                            await self._stop_cancelled(kernel, request, collector, started)
                            break
                        try:
                            message = await request.next(timer.remaining())
                        except TimeoutError:
                            if not timer.expired():
                                continue
                            assert timer.timeout is not None  # expired() says so
                            await self._stop_timed_out(kernel, request, collector, timer.timeout)
                            raise AssertionError("unreachable") from None
                        chunk, failure = self._handle(message, collector)
                        started = started or message.msg_type == "execute_input"
                        error = failure or error
                        if chunk is not None:
                            yield chunk
                except KernelDied:
                    # Whether the gateway answers is asked before the replacement (a restarted one would),
                    # what became of it after (its supervisor knows once it restarted it); what the kernel
                    # used against its limits too, before its group goes with it.
                    down = await self._gateway_down(kernel)
                    report = await kernel.report() if down is None else None
                    try:
                        await self._replace_kernel()
                        after = "It was replaced by a fresh kernel: all state is lost."
                    except GatewayUnreachableError:
                        after = "All state is lost, and no fresh kernel can be started without the gateway."
                    except Exception as e:
                        after = f"All state is lost, and no fresh kernel could be started: {e}"
                    if (limit_error := _memory_kill(report, after, collector)) is not None:
                        raise limit_error from None
                    cause = await self._death_cause(kernel, down)
                    raise KernelDiedError(
                        f"The kernel died while running this code ({cause}). {after}",
                        ename="KernelDied",
                        result=collector.result(),
                    ) from None
                finally:
                    cancellation.on_cancel(None)
                    kernel.finish(request)
                    self._timer = None
                result = collector.result()
                if cancelled:
                    # What the stopped code raised (KeyboardInterrupt, a rejected call) is how it stopped, not
                    # an error of its own.
                    yield replace(result, cancelled=True)
                    return
                if error is not None:
                    traceback = strip_ansi("\n".join(error.get("traceback", [])))
                    ename, evalue = error.get("ename", ""), error.get("evalue", "")
                    if ename == "MemoryError" and (
                        limit_error := _memory_refused(await kernel.report(), traceback, evalue, result)
                    ):
                        raise limit_error
                    raise CodeExecutionError(
                        traceback or f"{ename}: {evalue}", ename=ename, evalue=evalue, result=result
                    )
                yield result
            finally:
                self._cancellation = None

    async def _gateway_down(self, kernel: KernelConnection) -> str | None:
        if kernel.death_cause == "connection" and self._http is not None:
            return await gateway_down(self._http, self.endpoint)
        return None

    async def _death_cause(self, kernel: KernelConnection, down: str | None) -> str:
        if down is None:
            return _death_text(kernel)
        loss = None
        if self.gateway_loss is not None:
            try:
                loss = await self.gateway_loss()
            except Exception as e:  # the error to raise is the kernel's death, not this one
                logger.debug("could not learn what became of the kernel gateway: %s", e)
        return f"the kernel gateway went away: {loss or down}"

    @staticmethod
    def _handle(
        message: KernelMessage, collector: OutputCollector
    ) -> tuple[CodeExecutionChunk | None, dict[str, Any] | None]:
        content = message.content
        match message.msg_type:
            case "stream":
                name: StreamName = "stderr" if content.get("name") == "stderr" else "stdout"
                text = collector.add_text(content.get("text", ""), name)
                return (CodeExecutionChunk(text, name) if text else None), None
            case "execute_result" | "display_data":
                added = collector.add_result(content.get("data", {}))
                return (CodeExecutionChunk(added) if added else None), None
            case "error":
                return None, content
            case "execute_reply" if content.get("status") == "error":
                return None, content
        return None, None

    async def _stop_cancelled(
        self, kernel: KernelConnection, request: Request, collector: OutputCollector, started: bool
    ) -> None:
        """Interrupt a cancelled execution until it ends, collecting its output; replace the kernel if it
        still runs after `interrupt_grace` (or died meanwhile). `started`: the code's `execute_input` came."""
        import aiohttp

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.interrupt_grace
        # Before the code starts, wait for its `execute_input` (but not forever: a kernel may not send it).
        interrupt_at = loop.time() + (0 if started else _REINTERRUPT)
        try:
            while not request.done:
                if loop.time() >= deadline:
                    raise TimeoutError
                if loop.time() >= interrupt_at and not request.replied:  # replied: only idle is to come
                    with contextlib.suppress(GatewayError, aiohttp.ClientError):
                        await kernel.interrupt()
                    interrupt_at = loop.time() + _REINTERRUPT
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(min(interrupt_at, deadline)):
                        while not request.done:
                            message = await request.next(None)
                            self._handle(message, collector)
                            if message.msg_type == "execute_input":
                                interrupt_at = loop.time()  # the code runs now: interrupt it at once
                                break
        except (TimeoutError, KernelDied):
            await self._replace_kernel()
            logger.warning(
                "the cancelled code did not stop when interrupted: the kernel was replaced by a fresh one and "
                "its state is lost"
            )

    async def _stop_timed_out(
        self, kernel: KernelConnection, request: Request, collector: OutputCollector, timeout: float
    ) -> None:
        """Interrupt a timed-out execution; replace the kernel if that does not stop it. Always raises."""
        import aiohttp

        with contextlib.suppress(GatewayError, aiohttp.ClientError):
            await kernel.interrupt()
        try:
            async with asyncio.timeout(self.interrupt_grace):
                while not request.done:
                    self._handle(await request.next(None), collector)
        except (TimeoutError, KernelDied):
            await self._replace_kernel()
            raise ExecutionTimeoutError(
                f"{_exceeded(timeout)} It did not stop when interrupted: the kernel was replaced by a fresh "
                "one and its state is lost.",
                kernel_restarted=True,
                result=collector.result(),
            ) from None
        raise ExecutionTimeoutError(
            f"{_exceeded(timeout)} It was interrupted; the kernel keeps its state.",
            kernel_restarted=False,
            result=collector.result(),
        )


def _memory_kill(
    report: dict[str, Any] | None, after: str, collector: OutputCollector
) -> ResourceLimitError | None:
    """The error for a kernel that its control group's OOM killer ended, or `None` when that is not what
    killed it (no memory limit, no OOM kill counted)."""
    if not report:
        return None
    limit = report.get("limits", {}).get("memory")
    usage = report.get("usage", {})
    if not limit or not usage.get("oom_kills") or report.get("mechanism") == "rlimit":
        return None
    peak = usage.get("memory_peak")
    return ResourceLimitError(
        f"The code went over the kernel's memory limit ({_memory_text(limit, peak)}), and the kernel was "
        f"killed by the system's out-of-memory killer. {after} The next execution runs on the fresh kernel.",
        limit="memory",
        value=limit,
        peak=peak,
        kernel_restarted=True,
        result=collector.result(),
    )


def _memory_refused(
    report: dict[str, Any] | None, traceback: str, evalue: str, result: CodeExecutionResult
) -> ResourceLimitError | None:
    """The error for a `MemoryError` raised because the kernel's address-space limit refused an
    allocation (`setrlimit`), or `None` when the kernel has no such limit."""
    if not report or report.get("mechanism") != "rlimit":
        return None
    limit = report.get("limits", {}).get("memory")
    if not limit:
        return None
    peak = report.get("usage", {}).get("memory_peak")
    return ResourceLimitError(
        f"{traceback}\n\nMemoryError: the code asked for more memory than the kernel's limit allows "
        f"({_memory_text(limit, peak)}; enforced per process on its address space). The kernel keeps its state.",
        limit="memory",
        value=limit,
        peak=peak,
        kernel_restarted=False,
        ename="MemoryError",
        evalue=evalue,
        result=result,
    )


def _memory_text(limit: float, peak: int | None) -> str:
    text = f"limit {format_bytes(limit)}"
    return f"{text}, peak {format_bytes(peak)}" if peak else text


def _exceeded(timeout: float) -> str:
    # ipybox 0.9.2's sentence, word for word, so what matched its errors still matches ours.
    return f"Code execution exceeded timeout of {timeout:.2f}s (approval wait excluded)."


def _death_text(kernel: KernelConnection) -> str:
    if kernel.death_cause == "connection":
        return "the kernel gateway closed the connection to it"
    return "its process exited: os._exit(), a crash or running out of memory"
