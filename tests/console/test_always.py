"""The console's `always` answers and rule edits in process (no server, no browser): the preview of the
rule an answer writes, narrowing it, saving it with the real writer, and disabling or removing rules on
the Rules page with the real editor."""

from __future__ import annotations

import html
import re

import httpx
import pytest

from ipybox.config import load_config
from tests.console.conftest import ORIGIN, csrf_of
from tests.console.targets import RULES_FILE, WRITE, WorkspaceTarget, policy_of

FILE = RULES_FILE


@pytest.fixture
def workspace_target(target: WorkspaceTarget) -> WorkspaceTarget:
    """The target's rules in its `ipybox.toml`, and `always` answers written into it."""
    target.config_path.write_text(FILE)
    target.policy = load_config(target.config_path).approval
    target.write_rules = True
    return target


def preview_of(page: str) -> str:
    match = re.search(r'<pre class="rule-preview" id="rule-preview">(.*?)</pre>', page, re.S)
    assert match, "no preview on the page"
    return html.unescape(match.group(1))


def hidden_fields(page: str, form_id: str) -> dict[str, str]:
    form = page[page.index(f'id="{form_id}"') :]
    form = form[: form.index("</form>")]
    return {
        html.unescape(name): html.unescape(value)
        for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form)
    }


async def test_always_allow_opens_a_preview_of_the_exact_rule_and_saving_it_writes_that_rule(
    browser: httpx.AsyncClient, workspace_target: WorkspaceTarget
) -> None:
    target = workspace_target
    ask = target.ask()
    card = (await browser.get("/asks")).text
    assert f'<form method="get" action="/asks/{ask.id}/always" class="always-form">' in card
    response = await browser.get(f"/asks/{ask.id}/always", params={"accept": "allow"})
    assert response.status_code == 200
    text = preview_of(response.text)
    # The asking rule had no argument conditions: by default the rule requires the exact arguments.
    assert 'args = { path = "notes/a.md", content = "hello" }\n' in text
    assert 'id = "always-allow-filesystem-write_file"' in text and "priority = 1" in text
    assert 'id="always-any"' not in response.text
    assert target.config_path.read_text() == FILE, "a preview writes nothing"

    fields = hidden_fields(response.text, "save-form")
    assert fields["choice.path"] == "exact" and fields["scope"] == "always"
    saved = await browser.post(f"/asks/{ask.id}/answer", data=fields, headers={"Origin": ORIGIN})
    assert saved.status_code == 303
    assert target.answers[-1][1].choices == {"path": "exact", "content": "exact"}
    assert text in target.config_path.read_text(), "what the preview showed is what was written"
    assert target.board.get(ask.id) is None
    verdict = target.policy.decide(WRITE)
    assert (verdict.decision, verdict.rule_id) == ("allow", "always-allow-filesystem-write_file")
    other = WRITE.__class__(
        WRITE.server, WRITE.tool, {"path": "notes/b.md", "content": "x"}, WRITE.annotations
    )
    assert target.policy.decide(other).rule_id == "ask-for-writes"
    page = html.unescape((await browser.get("/asks")).text)
    assert "filesystem.write_file: allowed always by console (tester)." in page


async def test_narrowing_the_preview_without_javascript_changes_the_rule_and_any_is_said_aloud(
    browser: httpx.AsyncClient, workspace_target: WorkspaceTarget
) -> None:
    ask = workspace_target.ask()
    query = {"accept": "deny", "arg.path": "glob", "glob.path": "notes/*", "arg.content": "any"}
    page = (await browser.get(f"/asks/{ask.id}/always", params=query)).text
    assert 'args = { path = { glob = "notes/*" } }\n' in preview_of(page)
    assert 'decision = "deny"' in preview_of(page)
    assert hidden_fields(page, "save-form")["choice.path"] == "glob:notes/*"
    page = (
        await browser.get(
            f"/asks/{ask.id}/always", params={"accept": "allow", "arg.path": "any", "arg.content": "any"}
        )
    ).text
    assert "args = " not in preview_of(page).split("match = ")[0]
    assert 'id="always-any"' in page and "any arguments" in page


async def test_a_choice_that_would_not_decide_the_call_is_shown_and_offers_no_save(
    browser: httpx.AsyncClient, workspace_target: WorkspaceTarget
) -> None:
    ask = workspace_target.ask()
    query = {"accept": "allow", "arg.path": "glob", "glob.path": "out/*"}
    response = await browser.get(f"/asks/{ask.id}/always", params=query)
    assert response.status_code == 400
    assert "does not match this call&#39;s value" in response.text
    assert 'id="save-form"' not in response.text and 'id="rule-preview"' not in response.text


async def test_the_rules_page_disables_a_hand_written_rule_and_removes_one_an_answer_wrote(
    browser: httpx.AsyncClient, workspace_target: WorkspaceTarget
) -> None:
    target = workspace_target
    ask = target.ask()
    csrf = csrf_of((await browser.get("/asks")).text)
    await browser.post(
        f"/asks/{ask.id}/answer",
        data={"csrf": csrf, "accept": "allow", "scope": "always"},
        headers={"Origin": ORIGIN},
    )
    page = (await browser.get("/rules")).text
    row = page[page.index('data-rule-id="always-allow-filesystem-write_file"') :].split("</tr>")[0]
    assert 'data-edit="remove"' in row and "(an always answer)" in row
    hand = page[page.index('data-rule-id="no-secrets"') :].split("</tr>")[0]
    assert 'data-edit="disable"' in hand and 'data-edit="remove"' not in hand

    async def post(rule: str, edit: str) -> str:
        response = await browser.post(
            "/rules/edit", data={"csrf": csrf, "rule": rule, "edit": edit}, headers={"Origin": ORIGIN}
        )
        assert response.status_code == 303 and response.headers["location"] == "/rules"
        return html.unescape((await browser.get("/rules")).text)

    page = await post("no-secrets", "disable")
    assert "Rule 'no-secrets' disabled." in page
    assert 'data-rule-id="no-secrets" data-decision="deny" data-enabled="false"' in page
    assert "enabled = false" in target.config_path.read_text()
    assert not any(r.enabled for r in target.policy.rules if r.id == "no-secrets")
    page = await post("no-secrets", "remove")
    assert "Nothing changed: rule 'no-secrets' was not removed" in page and "written by hand" in page
    args = await browser.post(
        "/rules/args",
        data={
            "csrf": csrf,
            "rule": "always-allow-filesystem-write_file",
            "args": '{ path = { glob = "notes/*" } }',
        },
        headers={"Origin": ORIGIN},
    )
    assert args.status_code == 303
    page = html.unescape((await browser.get("/rules")).text)
    assert "Rule 'always-allow-filesystem-write_file': its argument conditions changed." in page
    assert 'value="{ path = { glob = "notes/*" } }"' in page
    other = WRITE.__class__(
        WRITE.server, WRITE.tool, {"path": "notes/b.md", "content": "x"}, WRITE.annotations
    )
    assert target.policy.decide(other).rule_id == "always-allow-filesystem-write_file"
    page = await post("always-allow-filesystem-write_file", "remove")
    assert "Rule 'always-allow-filesystem-write_file' removed." in page
    page = await post("no-secrets", "enable")
    assert target.config_path.read_text() == FILE, "the file is as it was before the answer"
    assert target.policy == policy_of(FILE)
