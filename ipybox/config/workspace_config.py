"""`WorkspaceConfig`: a workspace's `ipybox.toml`, with overrides from the environment and `.env`.

A workspace is a directory with an `ipybox.toml`: its MCP servers (`[servers.<name>]`), the kernel's
environment and limits (`[kernel]`), the sandbox (`[sandbox]`), credentials kernels use without seeing
them (`[secrets.<name>]`), tool-call approval rules (`[approval]`) and where agents reach it
(`[endpoints]`). See `ipybox.toml.example` for every option, and
`schemas/ipybox.schema.json` for editors.

Where a setting comes from, the first that has it winning:

1. environment variables: `IPYBOX_` + the keys joined by `__`, e.g. `IPYBOX_KERNEL__TIMEOUT=30`,
   `IPYBOX_SANDBOX__ENABLED=false`, `IPYBOX_ENDPOINTS__PORT=8765`;
2. the same variables in the workspace's `.env` (next to `ipybox.toml`; its other variables, such as
   secrets for `${VAR}` placeholders, are not settings and are left alone);
3. `ipybox.toml`;
4. the defaults.

Tables are merged key by key, so `IPYBOX_KERNEL__TIMEOUT` changes only `[kernel].timeout`. Names in
environment variables are case-insensitive: write keys in snake_case (`IPYBOX_SANDBOX__NETWORK__ALLOWED_DOMAINS`)
and lists or tables as JSON (`IPYBOX_SANDBOX__NETWORK__ALLOWED_DOMAINS='["pypi.org"]'`). Keys that are
data rather than settings (server names, `[kernel].env` variable names) are lower-cased there: set those
in the file.

Example:
    ```python
    from ipybox.config import load_config

    config = load_config("example-workspace")  # or the path of its ipybox.toml
    for name, server in config.enabled_servers().items():
        print(name, config.server_params(name))
    ```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from ipybox.config.secrets import SecretName, SecretSection
from ipybox.config.sections import EndpointsSection, KernelSection, SandboxSection, WorkspaceSection
from ipybox.config.servers import ServerName, ServerSection, TaggedServerSection
from ipybox.rules import ApprovalPolicy
from ipybox.rules.provenance import ProvenanceSettings
from ipybox.sandbox.policy import SandboxPolicy

ENV_PREFIX = "IPYBOX_"
ENV_NESTED_DELIMITER = "__"


class WorkspaceConfig(BaseSettings):
    """The configuration of a workspace: `ipybox.toml`, overridden by `IPYBOX_*` environment variables.

    Use `load_config()` to read a workspace; constructing the class directly gives the defaults
    overridden by the environment only.

    Attributes:
        workspace: `[workspace]`: name and directories.
        kernel: `[kernel]`: the kernels' environment, warm pool and execution time limit.
        sandbox: `[sandbox]`: whether kernels are sandboxed, and the policy.
        servers: `[servers.<name>]`: the MCP servers, by name.
        secrets: `[secrets.<name>]`: credentials the host resolves, which kernels use through placeholders
            that only the sandbox's proxy replaces, in requests to the secret's hosts
            (`ipybox.config.secrets`).
        approval: `[approval]`: rules deciding whether a tool call runs, is refused, or is asked about.
        provenance: `[provenance]`: how tool results are labelled (`[[provenance.sources]]`) and matched
            against later calls' arguments, which approval rules condition on.
        endpoints: `[endpoints]`: where `ipybox up` serves the workspace to agents.
    """

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
    )

    workspace: WorkspaceSection = Field(default_factory=WorkspaceSection)
    kernel: KernelSection = Field(default_factory=KernelSection)
    sandbox: SandboxSection = Field(default_factory=SandboxSection)
    servers: dict[ServerName, TaggedServerSection] = Field(
        default_factory=dict, json_schema_extra={"additionalProperties": False}
    )
    secrets: dict[SecretName, SecretSection] = Field(
        default_factory=dict, json_schema_extra={"additionalProperties": False}
    )
    approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    provenance: ProvenanceSettings = Field(default_factory=ProvenanceSettings)
    endpoints: EndpointsSection = Field(default_factory=EndpointsSection)

    _path: Path | None = PrivateAttr(default=None)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's values are passed as init arguments; they rank below the environment and `.env`.
        return (
            SpelledLikeTheFile(env_settings, init_settings),
            SpelledLikeTheFile(OwnSettingsOnly(dotenv_settings), init_settings),
            init_settings,
        )

    @property
    def path(self) -> Path | None:
        """The `ipybox.toml` this was loaded from (absolute), `None` if not loaded from a file."""
        return self._path

    @property
    def root(self) -> Path:
        """The workspace directory: where `ipybox.toml` is (the current directory if not from a file)."""
        return self._path.parent if self._path is not None else Path.cwd()

    @property
    def name(self) -> str:
        """`[workspace].name`, or the name of the workspace directory."""
        return self.workspace.name or self.root.name

    def resolve(self, path: str) -> Path:
        """A path from the configuration (such as `workspace.mcptools_dir`), made absolute against `root`."""
        return self.root / Path(path).expanduser()

    def enabled_servers(self) -> dict[str, ServerSection]:
        """The servers with `enabled = true`, by name."""
        return {name: server for name, server in self.servers.items() if server.enabled}

    def server_params(self, name: str) -> dict[str, Any]:
        """The parameters of server `name` for `ipybox.mcp_client` and `generate_mcp_sources`, with
        `${VAR}` placeholders left in and a stdio server's `cwd` resolved against the workspace.

        Raises:
            KeyError: There is no server `name`.
        """
        params = self.servers[name].server_params(self.root)
        if "sandbox" in params:
            # A server's sandbox guards its own `cwd`; the workspace's names and state are guarded too.
            policy = SandboxPolicy.model_validate(params["sandbox"]).guarding(
                self.root, self.resolve(self.workspace.state_dir), cwd=Path(params["cwd"])
            )
            params["sandbox"] = policy.model_dump(by_alias=True)
        return params


class OwnSettingsOnly(PydanticBaseSettingsSource):
    """A `.env` source without the variables that are not settings of ours: pydantic-settings passes them
    all on, and `extra="forbid"` would reject a `.env` that holds secrets for `${VAR}` placeholders."""

    def __init__(self, source: PydanticBaseSettingsSource) -> None:
        super().__init__(source.settings_cls)
        self._source = source

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        fields = self.settings_cls.model_fields
        return {key: value for key, value in self._source().items() if key in fields}


def spelling(key: str) -> str:
    """A key as variables can spell it: `allowedDomains`, `allowed_domains` and `ALLOWEDDOMAINS` are one."""
    return key.replace("_", "").lower()


def _respell(data: dict[str, Any], like: dict[str, Any]) -> dict[str, Any]:
    spelled = {spelling(key): key for key in like}
    out: dict[str, Any] = {}
    for key, value in data.items():
        key = spelled.get(spelling(key), key)
        theirs = like.get(key)
        out[key] = _respell(value, theirs) if isinstance(value, dict) and isinstance(theirs, dict) else value
    return out


class SpelledLikeTheFile(PydanticBaseSettingsSource):
    """A variables source whose keys take the file's spelling of the same key: an override of
    `allowedDomains` from `IPYBOX_SANDBOX__NETWORK__ALLOWED_DOMAINS` replaces the file's value instead of
    reaching the model as a second, conflicting key."""

    def __init__(self, source: PydanticBaseSettingsSource, file: PydanticBaseSettingsSource) -> None:
        super().__init__(source.settings_cls)
        self._source = source
        self._file = file

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        return _respell(self._source(), self._file())
