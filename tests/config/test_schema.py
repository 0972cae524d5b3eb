"""The published JSON Schema of `ipybox.toml`: current with the models, judging files as they do, and
shipped in the package (`ipybox/data/`, which the repository's `schemas/` and `ipybox.toml.example` link to)."""

from __future__ import annotations

import json
import tomllib
from typing import TYPE_CHECKING, Any

import pytest

from ipybox.config.schema import SCHEMA_FILE, example_path, render, schema_path, workspace_schema
from ipybox.sandbox import schema as sandbox_schema
from tests.config.conftest import ROOT

if TYPE_CHECKING:
    import jsonschema

EXAMPLES = ["ipybox.toml.example", "example-workspace/ipybox.toml"]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    # Imported here, not at collection: importing jsonschema imports rfc3987_syntax, which builds a grammar
    # (about 2.5 s of CPU) that every xdist worker would pay to collect this module.
    import jsonschema

    schema = json.loads((ROOT / "schemas" / SCHEMA_FILE).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_schema_file_is_current() -> None:
    path = ROOT / "schemas" / SCHEMA_FILE
    assert path.read_text() == render(), "schemas/ drifted: run `python -m ipybox.config.schema`"


def test_the_repository_paths_are_the_packaged_files() -> None:
    """The schemas and the example are package data; the repository's paths for people lead to them."""
    data = ROOT / "ipybox" / "data"
    assert (ROOT / "schemas").resolve() == data / "schemas" == schema_path().parent
    assert (ROOT / "ipybox.toml.example").resolve() == data / "ipybox.toml.example" == example_path()
    assert schema_path(sandbox_policy=True) == data / "schemas" / sandbox_schema.SCHEMA_FILE


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_files_validate(example: str, validator: jsonschema.Draft202012Validator) -> None:
    text = (ROOT / example).read_text()
    schema_line = text.splitlines()[0]
    assert schema_line.startswith("#:schema ")
    # The directive is relative to the file (as editors open it, through the repository's symlinks or
    # in the installed package): it must lead to the schema.
    assert (ROOT / example).parent.joinpath(schema_line.removeprefix("#:schema ")).resolve() == schema_path()
    if example == "ipybox.toml.example":
        assert (
            example_path().parent.joinpath(schema_line.removeprefix("#:schema ")).resolve() == schema_path()
        )
    errors = [error.message for error in validator.iter_errors(tomllib.loads(text))]
    assert errors == []


@pytest.mark.parametrize(
    "text",
    [
        '[servers.fs]\ncommand = "x"\nsandbox = true\n',
        '[servers.fs]\ncommand = "x"\n[servers.fs.sandbox.filesystem]\ndenyRead = ["~/.x"]\n',
        '[servers.gh]\nurl = "https://example.com/mcp"\ntype = "sse"\n',
        '[endpoints]\nhost = "::1"\n',
        '[kernel.limits]\nmemory = "unlimited"\ncpus = 1.5\nprocesses = "unlimited"\ntmp = "512MiB"\n',
        '[servers.fs]\ncommand = "x"\nlimits = { memory = 536870912, open_files = "unlimited" }\n',
    ],
)
def test_schema_accepts(text: str, validator: jsonschema.Draft202012Validator) -> None:
    assert list(validator.iter_errors(tomllib.loads(text))) == []


def test_schema_knows_the_published_spelling_only(validator: jsonschema.Draft202012Validator) -> None:
    # The models also take snake_case (`deny_read`); editors should steer to the sandbox-runtime format.
    assert list(validator.iter_errors({"sandbox": {"filesystem": {"deny_read": []}}})) != []
    assert list(validator.iter_errors({"sandbox": {"filesystem": {"denyRead": []}}})) == []


@pytest.mark.parametrize(
    "text",
    [
        '[servers.fs]\ncommand = "x"\nurl = "https://example.com/mcp"\n',
        "[servers.fs]\nargs = []\n",
        '[servers.gh]\nurl = "https://example.com/mcp"\nsandbox = true\n',
        '[servers.fs]\ncommand = "x"\nheaders = { A = "b" }\n',
        '[servers.my-server]\ncommand = "x"\n',
        '[servers.class]\ncommand = "x"\n',
        '[servers.fs]\ncomand = "x"\n',
        "[sandbox.filesystem]\ndenyReads = []\n",
        '[endpoints]\nhost = "0.0.0.0"\n',
        "[kernel]\nwarm_pool = -1\n",
        '[[approval.rules]]\ntool = "x"\n',
        '[kernel.limits]\nmemory = "lots"\n',
        "[kernel.limits]\nprocesses = 0\n",
        '[kernel.limits]\ncpus = "none"\n',
    ],
)
def test_schema_rejects_what_the_models_reject(text: str, validator: jsonschema.Draft202012Validator) -> None:
    assert list(validator.iter_errors(tomllib.loads(text))) != []


def _properties(schema: dict[str, Any], table: str) -> dict[str, Any]:
    properties: dict[str, Any] = schema["$defs"][table]["properties"]
    return properties


def test_keys_carry_their_documentation() -> None:
    schema = workspace_schema()
    assert "Loopback address" in _properties(schema, "EndpointsSection")["host"]["description"]
    assert "warm_pool" not in schema["$defs"]["KernelSection"]["description"]  # moved to the key
    assert _properties(schema, "KernelSection")["warm_pool"]["description"].startswith("Started kernels kept")
    text = json.dumps(schema)
    assert '{"type": "null"}' not in text and '"default": null' not in text  # TOML has no null


def test_examples_mention_every_key() -> None:
    """`ipybox.toml.example` documents every option: each key of the schema appears in it."""
    text = (ROOT / "ipybox.toml.example").read_text()
    schema = workspace_schema()
    tables = ["WorkspaceSection", "KernelSection", "SandboxSection", "FilesystemPolicy", "NetworkPolicy"]
    tables += ["StdioServerSection", "RemoteServerSection", "ServerSandbox", "ApprovalPolicy", "Rule"]
    tables += ["EndpointsSection", "SecretSection"]
    missing = [f"{table}.{key}" for table in tables for key in _properties(schema, table) if key not in text]
    assert missing == []
