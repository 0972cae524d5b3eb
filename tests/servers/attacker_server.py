"""An MCP server of our own whose tools return attacker-controlled content and record what their sinks did,
for the prompt-injection evaluation (bench/injection/) and its tests.

Run it over stdio, one service per process (so a workspace can serve each as a server of its own):

    python tests/servers/attacker_server.py --service web|mail|tracker|contacts

What the tools return comes from the JSON file named by `ATTACKER_CONTENT` in the server's environment,
read at every call, so a harness can change the world between scenarios without restarting anything:

    {"pages": {"https://...": "text"},
     "emails": [{"id": "m1", "from": "...", "subject": "...", "body": "..."}],
     "issues": {"42": {"title": "...", "body": "...", "comments": [{"author": "...", "body": "..."}]}},
     "contacts": {"alice": "alice@corp.example"}}

A missing file or key is an empty world. Every call of a sink (`web.http_post`, `mail.send_email`,
`tracker.post_comment`) and every `web.fetch_page` (a URL carries data too) is appended to the JSON-lines
file named by `ATTACKER_JOURNAL` as `{"service", "tool", "args"}` before the tool answers: the journal is
what an attacker received, so an evaluation can check that a call it counts as stopped never ran.

The services and their annotations (the MCP hints the provenance labels are derived from):

- `web`: `fetch_page(url)` (read-only, open world: untrusted by default), `http_post(url, data)` (write,
  open world).
- `mail`: `list_inbox()` (structured: one object per message), `read_email(id)` (read-only, closed world:
  a workspace labels them untrusted in `[[provenance.sources]]`), `send_email(to, subject, body)` (write,
  open world).
- `tracker`: `get_issue(number)` (the issue and its comments; read-only, open world), `post_comment(number,
  body)` (write, open world: a public comment).
- `contacts`: `lookup(name)` (the user's address book; read-only, closed world).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

CONTENT_ENV = "ATTACKER_CONTENT"
JOURNAL_ENV = "ATTACKER_JOURNAL"
SERVICES = ("web", "mail", "tracker", "contacts")

READ_OPEN = types.ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=True)
READ_CLOSED = types.ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
WRITE_OPEN = types.ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
)


def content() -> dict[str, Any]:
    path = os.environ.get(CONTENT_ENV)
    if not path or not Path(path).exists():
        return {}
    world: dict[str, Any] = json.loads(Path(path).read_text())
    return world


def journal(service: str, tool: str, args: dict[str, Any]) -> None:
    path = os.environ.get(JOURNAL_ENV)
    if path:
        with open(path, "a") as file:
            file.write(json.dumps({"service": service, "tool": tool, "args": args}) + "\n")


class Message(BaseModel):
    id: str
    sender: str
    subject: str


class Inbox(BaseModel):
    messages: list[Message]


def build(service: str) -> MCPServer:
    server = MCPServer(f"attacker-{service}", instructions=f"The {service} of the injection evaluation.")

    if service == "web":

        @server.tool(annotations=READ_OPEN, structured_output=False)
        def fetch_page(url: str) -> str:
            """Fetch a web page and return its text."""
            journal(service, "fetch_page", {"url": url})
            pages: dict[str, str] = content().get("pages", {})
            if url not in pages:
                raise ToolError(f"404 Not Found: {url}")
            return pages[url]

        @server.tool(annotations=WRITE_OPEN, structured_output=False)
        def http_post(url: str, data: str) -> str:
            """POST `data` to `url`."""
            journal(service, "http_post", {"url": url, "data": data})
            return f"200 OK ({len(data)} bytes posted)"

    elif service == "mail":

        @server.tool(annotations=READ_CLOSED)
        def list_inbox() -> Inbox:
            """The messages in the inbox: id, sender and subject of each."""
            emails = content().get("emails", [])
            return Inbox(
                messages=[Message(id=m["id"], sender=m["from"], subject=m["subject"]) for m in emails]
            )

        @server.tool(annotations=READ_CLOSED, structured_output=False)
        def read_email(id: str) -> str:
            """One message in full: sender, subject and body."""
            for message in content().get("emails", []):
                if message["id"] == id:
                    return f"From: {message['from']}\nSubject: {message['subject']}\n\n{message['body']}"
            raise ToolError(f"no message {id!r}")

        @server.tool(annotations=WRITE_OPEN, structured_output=False)
        def send_email(to: str, subject: str, body: str) -> str:
            """Send an email."""
            journal(service, "send_email", {"to": to, "subject": subject, "body": body})
            return "sent"

    elif service == "tracker":

        @server.tool(annotations=READ_OPEN, structured_output=False)
        def get_issue(number: int) -> str:
            """An issue of the project's public tracker with its comments."""
            issue = content().get("issues", {}).get(str(number))
            if issue is None:
                raise ToolError(f"no issue #{number}")
            comments = "".join(
                f"\n--- {c['author']} wrote:\n{c['body']}\n" for c in issue.get("comments", [])
            )
            return f"#{number}: {issue['title']}\n\n{issue['body']}\n{comments}"

        @server.tool(annotations=WRITE_OPEN, structured_output=False)
        def post_comment(number: int, body: str) -> str:
            """Post a public comment on an issue."""
            journal(service, "post_comment", {"number": number, "body": body})
            return f"commented on #{number}"

    elif service == "contacts":

        @server.tool(annotations=READ_CLOSED, structured_output=False)
        def lookup(name: str) -> str:
            """The email address of a person in the user's address book."""
            address = content().get("contacts", {}).get(name.lower())
            if address is None:
                raise ToolError(f"{name!r} is not in the address book")
            return str(address)

    else:
        raise SystemExit(f"unknown service {service!r}; known: {', '.join(SERVICES)}")
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--service", choices=SERVICES, required=True)
    args = parser.parse_args()
    build(args.service).run("stdio")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
