"""`search_tools`' index (`ipybox.codeact.index.ToolIndex`) over 500 generated tools: 10 servers x 50
tools, written by the real generator from tool schemas with realistic descriptions and parameters, plus
what an agent reads to find the tool for a task. Ours only (the peer has no tool search).

Metrics:
- `tool_search.build`: a full index build, cold: a new empty database file, `ToolIndex(...)` + `sync()`
  (parses all 500 modules). One sample per fresh database.
- `tool_search.sync_unchanged`: `sync()` with nothing changed (stats 500 files, parses none).
- `tool_search.sync_one_server`: `sync()` after one server was regenerated (50 new files; the
  regeneration itself is not timed).
- `tool_search.search`: `search(query, limit=5)`, warm, as `search_tools` calls it (a `sync()` included),
  cycling through 50 task-like queries; the status has median and p95.
- `tool_search.tokens`: no timing. For 10 tasks with a known right tool, the text an agent reads:
  (a) the `search_tools` answer (5 hits: module, path, signature, description) plus the right module's
  file; (b) the server's index (`mcptools/<server>/__init__.py`) plus the right module's file; (c) every
  module of the server, whole. Tokens are approximated as characters / 4 (no tokenizer is installed in
  the bench venv). Also: in how many tasks the right tool was the first hit, and among the 5.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from _protocol import Stopwatch, emit, log, parse_args

from ipybox.codeact.index import ToolHit, ToolIndex
from ipybox.mcp_apigen import write_mcp_sources

# server: (what its objects live in, {noun: (plural, what it is, parameters beyond the scope's)}).
DOMAINS: dict[str, tuple[str, dict[str, tuple[str, str, list[str]]]]] = {
    "github": (
        "in a GitHub repository",
        {
            "commit": (
                "commits",
                "A commit records a change with its author, message, date and parent commits.",
                ["sha", "author", "since"],
            ),
            "branch": (
                "branches",
                "A branch is a named line of development pointing at a commit.",
                ["branch", "protected"],
            ),
            "issue": (
                "issues",
                "An issue tracks a bug, task or feature request with labels and assignees.",
                ["issue_number", "state", "labels", "assignee"],
            ),
            "pull_request": (
                "pull requests",
                "A pull request proposes merging a head branch into a base branch, with reviews.",
                ["pull_number", "head", "base", "draft"],
            ),
            "release": (
                "releases",
                "A release publishes a tagged version with notes and downloadable assets.",
                ["tag_name", "prerelease"],
            ),
            "file_content": (
                "file contents",
                "The contents of a file or directory at a path and ref.",
                ["path", "ref", "content", "message"],
            ),
            "workflow_run": (
                "workflow runs",
                "A workflow run is one execution of a GitHub Actions workflow, with its jobs and logs.",
                ["workflow_id", "status", "conclusion"],
            ),
            "comment": (
                "comments",
                "A comment on an issue or pull request, in Markdown.",
                ["issue_number", "body"],
            ),
            "label": (
                "labels",
                "A label categorizes issues and pull requests by name and color.",
                ["name", "color"],
            ),
            "webhook": (
                "webhooks",
                "A webhook delivers repository events to an external URL.",
                ["url", "events", "secret"],
            ),
        },
    ),
    "gitlab": (
        "in a GitLab project",
        {
            "merge_request": (
                "merge requests",
                "A merge request proposes merging a source branch into a target branch, with approvals.",
                ["merge_request_iid", "source_branch", "target_branch"],
            ),
            "pipeline": (
                "pipelines",
                "A CI/CD pipeline runs jobs in stages for a commit or branch.",
                ["pipeline_id", "ref", "status"],
            ),
            "job": (
                "jobs",
                "A CI job runs a script on a runner and produces a log and artifacts.",
                ["job_id", "stage", "scope"],
            ),
            "project_variable": (
                "project variables",
                "A CI/CD variable passed to jobs, optionally masked or protected.",
                ["key", "value", "masked"],
            ),
            "milestone": (
                "milestones",
                "A milestone groups issues and merge requests towards a due date.",
                ["milestone_id", "due_date", "state"],
            ),
            "wiki_page": (
                "wiki pages",
                "A wiki page holds project documentation in Markdown.",
                ["slug", "title", "content"],
            ),
            "snippet": (
                "snippets",
                "A snippet is a piece of code or text shared with the project.",
                ["snippet_id", "file_name", "visibility"],
            ),
            "deploy_key": (
                "deploy keys",
                "A deploy key grants read or write access to the repository over SSH.",
                ["key_id", "can_push"],
            ),
            "environment": (
                "environments",
                "An environment is a deployment target such as staging or production.",
                ["environment_id", "external_url"],
            ),
            "tag": (
                "tags",
                "A tag marks a specific commit, usually a release.",
                ["tag_name", "ref", "message"],
            ),
        },
    ),
    "slack": (
        "in a Slack workspace",
        {
            "message": (
                "messages",
                "A message is text posted (sent) to a channel or thread, with blocks and attachments.",
                ["channel_id", "text", "thread_ts"],
            ),
            "channel": (
                "channels",
                "A channel is a shared conversation for a team or topic, public or private.",
                ["channel_id", "name", "is_private"],
            ),
            "user": (
                "users",
                "A user is a member of the workspace with a profile and presence.",
                ["user_id", "email"],
            ),
            "reaction": (
                "reactions",
                "A reaction is an emoji added to a message.",
                ["channel_id", "timestamp", "emoji_name"],
            ),
            "reminder": (
                "reminders",
                "A reminder notifies a user about something at a given time.",
                ["text", "time", "user_id"],
            ),
            "file": (
                "files",
                "A file uploaded to a channel or direct message.",
                ["file_id", "channels", "filename"],
            ),
            "user_group": (
                "user groups",
                "A user group lets a set of users be mentioned together.",
                ["usergroup_id", "handle"],
            ),
            "bookmark": (
                "bookmarks",
                "A bookmark pins a link at the top of a channel.",
                ["channel_id", "link", "title"],
            ),
            "scheduled_message": (
                "scheduled messages",
                "A scheduled message is sent to a channel at a later time.",
                ["channel_id", "post_at", "text"],
            ),
            "pin": (
                "pins",
                "A pin keeps an important message at hand in a channel.",
                ["channel_id", "timestamp"],
            ),
        },
    ),
    "jira": (
        "in a Jira site",
        {
            "issue": (
                "issues",
                "A Jira issue is a story, bug or task with a status, assignee and sprint.",
                ["issue_key", "jql", "assignee", "status"],
            ),
            "project": (
                "projects",
                "A project groups issues under a key and a workflow.",
                ["project_key", "lead"],
            ),
            "sprint": (
                "sprints",
                "A sprint is a time box of an agile board with committed issues.",
                ["sprint_id", "board_id", "state"],
            ),
            "board": ("boards", "A Scrum or Kanban board shows issues by column.", ["board_id", "type"]),
            "worklog": (
                "worklogs",
                "A worklog records time spent on an issue.",
                ["issue_key", "time_spent", "started"],
            ),
            "issue_comment": ("issue comments", "A comment discussing an issue.", ["issue_key", "body"]),
            "version": (
                "versions",
                "A version (fix version) is a release milestone of a project.",
                ["version_id", "release_date"],
            ),
            "component": (
                "components",
                "A component is a part of a project that issues are filed against.",
                ["component_id", "lead"],
            ),
            "filter": (
                "filters",
                "A saved filter stores a JQL query for reuse and sharing.",
                ["filter_id", "jql"],
            ),
            "transition": (
                "transitions",
                "A transition moves an issue from one workflow status to another.",
                ["issue_key", "transition_id"],
            ),
        },
    ),
    "filesystem": (
        "under the allowed directories",
        {
            "file": (
                "files",
                "A file's complete contents as text, or its bytes as base64.",
                ["path", "encoding", "head", "tail"],
            ),
            "directory": (
                "directories",
                "A directory listing with file and subdirectory names.",
                ["path", "recursive"],
            ),
            "symlink": ("symlinks", "A symbolic link pointing at another path.", ["path", "target"]),
            "file_info": ("file infos", "Metadata of a file: size, times, permissions and type.", ["path"]),
            "archive": (
                "archives",
                "A zip or tar archive of files and directories.",
                ["path", "format", "files"],
            ),
            "permission": ("permissions", "The mode bits and owner of a file.", ["path", "mode", "owner"]),
            "watch": ("watches", "A watch reports changes to files under a path.", ["path", "pattern"]),
            "text_edit": (
                "text edits",
                "A line-based edit of a text file, shown as a git-style diff.",
                ["path", "edits", "dry_run"],
            ),
            "search_result": (
                "search results",
                "Files and directories whose names match a glob pattern.",
                ["path", "pattern", "exclude_patterns"],
            ),
            "temp_file": (
                "temporary files",
                "A temporary file that is deleted when no longer needed.",
                ["suffix", "content"],
            ),
        },
    ),
    "postgres": (
        "in a PostgreSQL database",
        {
            "query": ("queries", "A read-only SQL query and its result rows.", ["sql", "params", "max_rows"]),
            "table": (
                "tables",
                "A table with its columns, types, constraints and row count.",
                ["schema", "table_name"],
            ),
            "index": (
                "indexes",
                "An index speeds up lookups on columns of a table.",
                ["table_name", "columns", "unique"],
            ),
            "view": (
                "views",
                "A view is a stored query that behaves like a table.",
                ["view_name", "definition"],
            ),
            "role": ("roles", "A role (user or group) with login and privileges.", ["role_name", "login"]),
            "extension": (
                "extensions",
                "An extension adds types and functions, like postgis or pg_trgm.",
                ["extension_name", "version"],
            ),
            "schema": (
                "schemas",
                "A schema is a namespace of tables, views and functions.",
                ["schema_name", "owner"],
            ),
            "backup": (
                "backups",
                "A logical backup of the database made with pg_dump.",
                ["backup_id", "format"],
            ),
            "slow_query": (
                "slow queries",
                "Statements with the highest total execution time, from pg_stat_statements.",
                ["min_duration_ms", "limit"],
            ),
            "connection": (
                "connections",
                "A client connection with its state and current statement.",
                ["pid", "state"],
            ),
        },
    ),
    "calendar": (
        "in a Google Calendar",
        {
            "event": (
                "events",
                "An event (meeting) with a start and end time, attendees and a location.",
                ["calendar_id", "event_id", "start", "end", "attendees"],
            ),
            "calendar": (
                "calendars",
                "A calendar owned by or shared with the user.",
                ["calendar_id", "summary", "time_zone"],
            ),
            "attendee": (
                "attendees",
                "An attendee of an event and their response status.",
                ["event_id", "email", "response_status"],
            ),
            "free_busy": (
                "free/busy blocks",
                "When calendars are free or busy in a time range, to schedule a meeting.",
                ["time_min", "time_max", "calendars"],
            ),
            "reminder": (
                "reminders",
                "A reminder notifies before an event starts.",
                ["event_id", "minutes", "method"],
            ),
            "recurrence": (
                "recurrences",
                "A recurrence rule repeats an event (RRULE).",
                ["event_id", "rrule"],
            ),
            "acl_rule": (
                "access rules",
                "An access control rule shares a calendar with a person or group.",
                ["calendar_id", "role", "scope"],
            ),
            "color": ("colors", "A color for calendars and events.", ["color_id"]),
            "working_location": (
                "working locations",
                "Where the user works on a day: home, office or elsewhere.",
                ["date", "type"],
            ),
            "out_of_office": (
                "out-of-office entries",
                "An out-of-office block that declines meetings automatically.",
                ["start", "end", "decline_message"],
            ),
        },
    ),
    "gmail": (
        "in the user's Gmail mailbox",
        {
            "message": (
                "messages",
                "An email message with headers, body and attachments; sending delivers it to its recipients.",
                ["to", "subject", "body", "attachments"],
            ),
            "draft": (
                "drafts",
                "A draft email that can be edited and sent later.",
                ["draft_id", "to", "subject", "body"],
            ),
            "thread": (
                "threads",
                "A thread is a conversation of messages and replies.",
                ["thread_id", "query"],
            ),
            "label": ("labels", "A label organizes messages, like a folder.", ["label_id", "name"]),
            "filter": (
                "filters",
                "A filter applies actions to incoming messages that match criteria.",
                ["criteria", "action"],
            ),
            "attachment": ("attachments", "A file attached to a message.", ["message_id", "attachment_id"]),
            "forwarding_address": (
                "forwarding addresses",
                "An address incoming mail can be forwarded to.",
                ["forwarding_email"],
            ),
            "vacation_setting": (
                "vacation settings",
                "The auto-reply sent while the user is away.",
                ["enable_auto_reply", "response_body"],
            ),
            "signature": (
                "signatures",
                "The signature appended to outgoing messages.",
                ["send_as_email", "signature"],
            ),
            "delegate": (
                "delegates",
                "A delegate can read and send mail on the user's behalf.",
                ["delegate_email"],
            ),
        },
    ),
    "kubernetes": (
        "in a Kubernetes cluster",
        {
            "pod": (
                "pods",
                "A pod runs one or more containers on a node; its logs show their output.",
                ["namespace", "pod_name", "container"],
            ),
            "deployment": (
                "deployments",
                "A deployment keeps replicas of a pod template running and rolls out (restarts) updates.",
                ["namespace", "deployment_name", "replicas", "image"],
            ),
            "service": (
                "services",
                "A service exposes pods on a stable address and port.",
                ["namespace", "service_name", "port"],
            ),
            "config_map": (
                "config maps",
                "A config map holds configuration as key-value pairs.",
                ["namespace", "name", "data"],
            ),
            "secret": (
                "secrets",
                "A secret holds credentials such as passwords and tokens.",
                ["namespace", "name", "type"],
            ),
            "namespace": ("namespaces", "A namespace isolates groups of resources.", ["namespace", "labels"]),
            "node": (
                "nodes",
                "A node is a machine that runs pods, with capacity and conditions.",
                ["node_name", "cordon"],
            ),
            "ingress": (
                "ingresses",
                "An ingress routes external HTTP traffic to services by host and path.",
                ["namespace", "host", "path"],
            ),
            "cron_job": (
                "cron jobs",
                "A cron job runs a job on a schedule.",
                ["namespace", "schedule", "suspend"],
            ),
            "event": (
                "events",
                "An event reports something that happened to a resource, like a failed scheduling.",
                ["namespace", "field_selector"],
            ),
        },
    ),
    "stripe": (
        "in a Stripe account",
        {
            "customer": (
                "customers",
                "A customer with an email, payment methods and billing details.",
                ["customer_id", "email"],
            ),
            "payment_intent": (
                "payment intents",
                "A payment intent collects a payment from a customer for an amount.",
                ["payment_intent_id", "amount", "currency"],
            ),
            "refund": (
                "refunds",
                "A refund returns all or part of a charge (a payment) to the customer.",
                ["charge", "amount", "reason"],
            ),
            "invoice": (
                "invoices",
                "An invoice bills a customer for subscription or one-off items.",
                ["invoice_id", "customer_id", "due_date"],
            ),
            "subscription": (
                "subscriptions",
                "A subscription charges a customer on a recurring price.",
                ["subscription_id", "price_id", "cancel_at_period_end"],
            ),
            "product": (
                "products",
                "A product is something sold, with prices.",
                ["product_id", "name", "active"],
            ),
            "price": (
                "prices",
                "A price sets the amount and interval of a product.",
                ["price_id", "unit_amount", "recurring"],
            ),
            "coupon": (
                "coupons",
                "A coupon gives a discount on invoices or subscriptions.",
                ["coupon_id", "percent_off", "duration"],
            ),
            "payout": (
                "payouts",
                "A payout sends the balance to a bank account.",
                ["payout_id", "amount", "arrival_date"],
            ),
            "dispute": (
                "disputes",
                "A dispute (chargeback) contests a charge with the card issuer.",
                ["dispute_id", "evidence"],
            ),
        },
    ),
}

VERBS = {
    "list": "List {plural} {scope}, newest first. Supports pagination with page and per_page and filtering by {filters}.",
    "get": "Get one {noun} {scope} by its identifier, with all of its fields.",
    "create": "Create a new {noun} {scope}.",
    "update": "Update an existing {noun} {scope}; only the fields given change.",
    "delete": "Delete a {noun} {scope}. This cannot be undone.",
}

# (query an agent might send, the tool it needs): 10 tasks for the token comparison, 50 queries for timing.
TASKS = [
    ("list the latest commits of a repository", "github.list_commit"),
    ("send a message to a slack channel", "slack.create_message"),
    ("find open issues assigned to me in jira with jql", "jira.list_issue"),
    ("read the contents of a text file", "filesystem.get_file"),
    ("run a sql query on the database", "postgres.create_query"),
    ("schedule a meeting with attendees", "calendar.create_event"),
    ("send an email with an attachment", "gmail.create_message"),
    ("scale the replicas of a deployment", "kubernetes.update_deployment"),
    ("refund a payment to a customer", "stripe.create_refund"),
    ("show failed pipelines of a gitlab project", "gitlab.list_pipeline"),
]
MORE_QUERIES = [
    "merge a pull request",
    "create a branch",
    "pod logs",
    "cancel a subscription",
    "upload a file to slack",
    "add a label to an issue",
    "workflow run logs",
    "list directory",
    "move an issue to done",
    "slow queries",
    "create an index on a table",
    "out of office",
    "invoice for a customer",
    "restart deployment",
    "secrets",
    "pipeline jobs",
    "release notes",
    "search files by pattern",
    "forward email",
    "free busy time",
    "add reaction emoji",
    "cron schedule",
    "coupon discount",
    "webhook events",
    "sprint board",
    "wiki page",
    "deploy key",
    "user email",
    "draft reply",
    "ingress host",
    "tag a release",
    "log time on issue",
    "database roles",
    "chargeback evidence",
    "calendar sharing",
    "payout to bank",
    "thread replies",
    "config map data",
    "namespace labels",
    "milestone due date",
]
QUERIES = [query for query, _ in TASKS] + MORE_QUERIES


def tools_of(server: str) -> list[dict[str, Any]]:
    scope, nouns = DOMAINS[server]
    tools = []
    for noun, (plural, what, params) in nouns.items():
        for verb, template in VERBS.items():
            description = template.format(
                noun=noun.replace("_", " "), plural=plural, scope=scope, filters=", ".join(params[:2])
            )
            properties: dict[str, Any] = {
                p: {
                    "type": "integer" if p.endswith(("_id", "number", "replicas", "amount")) else "string",
                    "description": f"The {p.replace('_', ' ')}.",
                }
                for p in params
            }
            if verb == "list":
                properties |= {
                    "page": {"type": "integer", "description": "Page number (1-based)."},
                    "per_page": {"type": "integer", "description": "Results per page (max 100)."},
                }
            tool: dict[str, Any] = {
                "name": f"{verb}_{noun}",
                "description": f"{description}\n\n{what}",
                "input_schema": {"type": "object", "properties": properties, "required": params[:1]},
            }
            if verb in ("get", "create"):
                tool["output_schema"] = {
                    "type": "object",
                    "properties": {"id": {"type": "string"}, **{p: {"type": "string"} for p in params}},
                }
            tools.append(tool)
    return tools


def generate(root: Path) -> None:
    for server in DOMAINS:
        write_mcp_sources(server, tools_of(server), root)


def tokens(text: str) -> int:
    return round(len(text) / 4)


def answer_text(hits: list[ToolHit]) -> str:
    """What `search_tools` hands an agent: one block per hit."""
    return "\n".join(f"{h.module} ({h.path})\n  {h.signature}\n  {h.description}" for h in hits)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    args = parse_args(__doc__ or "", default_runs=50, default_warmup=5)
    with tempfile.TemporaryDirectory(prefix="bench-tool-search-") as tmp:
        workspace = Path(tmp)
        mcptools = workspace / "mcptools"
        generate(mcptools)
        count = sum(1 for _ in mcptools.glob("*/*.py")) - len(DOMAINS)
        log(f"generated {count} tool modules in {len(DOMAINS)} servers")

        build = Stopwatch()
        for i in range(min(args.runs, 10) + 1):  # the first warms the page cache and imports
            with build.measure(keep=i > 0):
                index = ToolIndex(mcptools, workspace / f"build-{i}.db")
                changed = index.sync()
            index.close()
        emit("tool_search.build", build.samples_ms, info={"tools": count, "entries": changed})

        with ToolIndex(mcptools, workspace / "index.db") as index:
            index.sync()
            unchanged = Stopwatch()
            for i in range(args.warmup + args.runs):
                with unchanged.measure(keep=i >= args.warmup):
                    index.sync()
            emit("tool_search.sync_unchanged", unchanged.samples_ms, info={"tools": count})

            one = Stopwatch()
            for i in range(min(args.runs, 20) + 1):
                write_mcp_sources("slack", tools_of("slack"), mcptools)
                with one.measure(keep=i > 0):
                    changed = index.sync()
            emit("tool_search.sync_one_server", one.samples_ms, info={"entries": changed})

            search = Stopwatch()
            for i in range(args.warmup + args.runs):
                query = QUERIES[i % len(QUERIES)]
                with search.measure(keep=i >= args.warmup):
                    index.search(query, limit=5)
            samples = search.samples_ms
            p95 = percentile(samples, 0.95)
            emit(
                "tool_search.search",
                samples,
                status=f"median {statistics.median(samples):.2f} ms, p95 {p95:.2f} ms over {len(samples)} queries",
                info={"p95_ms": round(p95, 3), "tools": count, "limit": 5},
            )

            rows = []
            first = top5 = 0
            for query, expected in TASKS:
                server, module = expected.split(".")
                hits = index.search(query, limit=5)
                found = [h.module for h in hits]
                wanted = f"mcptools.{server}.{module}"
                first += found[:1] == [wanted]
                top5 += wanted in found
                module_text = (mcptools / server / f"{module}.py").read_text()
                via_search = tokens(answer_text(hits) + module_text)
                via_index = tokens((mcptools / server / "__init__.py").read_text() + module_text)
                whole = tokens("".join(p.read_text() for p in sorted((mcptools / server).glob("*.py"))))
                rows.append(
                    {
                        "task": query,
                        "search_and_read": via_search,
                        "index_and_read": via_index,
                        "whole_server": whole,
                    }
                )
            total = {
                key: sum(r[key] for r in rows)
                for key in ("search_and_read", "index_and_read", "whole_server")
            }
            per_task = {key: value // len(rows) for key, value in total.items()}
            emit(
                "tool_search.tokens",
                [],
                status=(
                    f"per task (tokens ~ chars/4): search answer + 1 module {per_task['search_and_read']}, "
                    f"server index + 1 module {per_task['index_and_read']}, whole server "
                    f"{per_task['whole_server']} ({per_task['whole_server'] / per_task['search_and_read']:.0f}x); "
                    f"right tool first {first}/{len(TASKS)}, in top 5 {top5}/{len(TASKS)}"
                ),
                info={"per_task": per_task, "tasks": rows, "first": first, "top5": top5},
            )


if __name__ == "__main__":
    main()
