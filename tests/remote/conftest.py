"""Fixtures for kernels on a real Jupyter Enterprise Gateway (see `tests.remote.eg`).

The gateway itself is `enterprise_gateway` (tests/conftest.py: the in-kernel tests use it too). One gateway
per test process, started on first use and stopped when the process ends: under pytest-xdist
(`--dist loadfile`) that is at most one per worker that runs a module of this package, each on its own port
with its own token and directories. A test that restarts or kills it (`await enterprise_gateway.arestart()`,
`arestart(signal.SIGKILL)` for a crash) leaves
it running again on the same port and token; kernels started before are gone then, as on a real gateway.
"""

from __future__ import annotations

import pytest

from ipybox.kernels.gateway import GatewayEndpoint
from tests.remote.eg import EnterpriseGateway


@pytest.fixture
def eg_endpoint(enterprise_gateway: EnterpriseGateway) -> GatewayEndpoint:
    """The running gateway's endpoint for `KernelClient` / `CodeExecutor` (per test: a restart keeps it)."""
    return GatewayEndpoint(enterprise_gateway.url, enterprise_gateway.token)
