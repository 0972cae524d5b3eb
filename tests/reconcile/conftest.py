"""Reconciler tests use the configuration tests' workspace: a fresh directory for `ipybox.toml`, and an
environment without `IPYBOX_*` variables."""

from tests.config.conftest import _no_ipybox_variables, workspace, write_config

__all__ = ["_no_ipybox_variables", "workspace", "write_config"]
