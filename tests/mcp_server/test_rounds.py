"""Operations (`ipybox.mcp_server.rounds`): work that asks its client across requests. Pure asyncio, no
processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import mcp_types as types
import pytest
from mcp.server.mcpserver.exceptions import ToolError

from ipybox.lifecycle import Service
from ipybox.mcp_server.rounds import Operation, Operations

ALLOW = types.ElicitResult(action="accept", content={"allow": True})
DENY = types.ElicitResult(action="accept", content={"allow": False})


@pytest.fixture
async def operations() -> AsyncIterator[Operations]:
    operations = Operations(keep=0.05)
    async with Service("operations") as service:
        operations.attach(lambda work, name: service.spawn(work, name=name))
        yield operations


async def test_work_that_asks_waits_for_the_answer_and_resumes_where_it_asked(operations: Operations) -> None:
    steps: list[str] = []

    async def work(op: Operation[str]) -> str:
        steps.append("before")
        allowed = await op.ask("allow?", {"tool": "t"})
        steps.append("after")
        return f"allowed={allowed}"

    op = operations.start(Operation[str]("me"), work)
    assert await op.wait() == "asking"
    (key,) = op.questions
    assert op.questions[key].request().params.message == "allow?"
    op.answer({key: ALLOW})
    assert await op.wait() == "done"
    assert op.result() == "allowed=True" and steps == ["before", "after"]


@pytest.mark.parametrize(
    "response",
    [
        DENY,
        types.ElicitResult(action="decline"),
        types.ElicitResult(action="accept", content={"allow": "yes"}),
    ],
)
async def test_anything_but_an_accepted_allow_denies(
    operations: Operations, response: types.ElicitResult
) -> None:
    op = operations.start(Operation[bool]("me"), lambda op: op.ask("allow?"))
    await op.wait()
    op.answer({key: response for key in op.questions})
    await op.wait()
    assert op.result() is False


async def test_answers_to_questions_not_outstanding_are_ignored(operations: Operations) -> None:
    op = operations.start(Operation[bool]("me"), lambda op: op.ask("allow?"))
    await op.wait()
    op.answer({"ask-99": ALLOW})
    assert op.status == "asking"
    (key,) = op.questions
    op.answer({key: DENY})
    op.answer({key: ALLOW})  # answered already: no second answer
    await op.wait()
    assert op.result() is False


async def test_a_question_settled_elsewhere_is_withdrawn(operations: Operations) -> None:
    settled: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    op = operations.start(Operation[bool]("me"), lambda op: op.ask("allow?", settled=settled))
    await op.wait()
    settled.set_result(True)
    assert await op.wait() == "done"
    assert op.questions == {} and op.result() is True


async def test_a_retry_resumes_only_its_own_callers_latest_round(operations: Operations) -> None:
    op = operations.start(Operation[bool]("me"), lambda op: op.ask("allow?"))
    await op.wait()
    op.round = 1
    assert operations.resume(op.state, "me") is op
    with pytest.raises(ToolError, match="belongs to another client"):
        operations.resume(op.state, "someone else")
    with pytest.raises(ToolError, match="answered already"):
        operations.resume(f"{op.id}.0", "me")
    with pytest.raises(ToolError, match="has ended"):
        operations.resume("made-up.1", "me")


async def test_a_failure_is_the_operations_value_and_the_others_keep_running(operations: Operations) -> None:
    async def fails(op: Operation[str]) -> str:
        raise ToolError("it broke")

    async def asks(op: Operation[bool]) -> bool:
        return await op.ask("allow?")

    failing = operations.start(Operation[str]("me"), fails)
    asking = operations.start(Operation[bool]("me"), asks)
    await failing.wait()
    with pytest.raises(ToolError, match="it broke"):
        failing.result()
    assert await asking.wait() == "asking"


async def test_cancel_denies_the_questions_and_runs_what_stops_the_work(operations: Operations) -> None:
    stopped: list[bool] = []

    async def stop() -> None:
        stopped.append(True)

    op = Operation[bool]("me")
    op.on_cancel(stop)
    operations.start(op, lambda op: op.ask("allow?"))
    await op.wait()
    await op.cancel()
    await op.wait()
    assert op.result() is False and stopped == [True] and op.cancelled


async def test_collected_and_expired_operations_are_swept(operations: Operations) -> None:
    async def value(op: Operation[int]) -> int:
        return 1

    collected = operations.start(Operation[int]("me"), value)
    uncollected = operations.start(Operation[int]("me"), value)
    await collected.wait()
    await uncollected.wait()
    collected.result()
    operations.sweep()
    assert operations.get(collected.id, "me") is None and operations.get(uncollected.id, "me") is uncollected
    await asyncio.sleep(0.06)
    operations.sweep()
    assert operations.get(uncollected.id, "me") is None


async def test_starting_work_outside_a_running_server_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="not running"):
        Operations().start(Operation[int]("me"), lambda op: asyncio.sleep(0, 1))
