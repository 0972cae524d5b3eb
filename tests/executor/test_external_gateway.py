"""`ExternalGateway`'s settings for kernels that share no file with this machine, and what a kernel start
request to such a gateway carries (pure logic; the gateway itself: tests/remote/test_remote_executor.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.executor.external_kernels import request_env
from ipybox.executor.options import ExternalGateway


def test_a_call_channel_certificate_without_its_key_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="calls_cert and calls_key go together"):
        ExternalGateway("http://eg:8888", calls_cert=Path("cert.pem"))
    with pytest.raises(ValueError, match="calls_cert and calls_key go together"):
        ExternalGateway("http://eg:8888", calls_key=Path("key.pem"))


@pytest.mark.parametrize("bind", ["0.0.0.0", "host:port", ""])
def test_a_calls_bind_that_names_no_port_is_refused(bind: str) -> None:
    with pytest.raises(ValueError, match="calls_bind"):
        ExternalGateway("http://eg:8888", calls_bind=bind)


def test_an_empty_kernelspec_is_refused() -> None:
    with pytest.raises(ValueError, match="kernelspec"):
        ExternalGateway("http://eg:8888", kernelspec=" ")


def test_the_defaults_listen_on_loopback_and_start_the_gateways_default_kernel_spec() -> None:
    gateway = ExternalGateway("http://eg:8888", "t")
    assert (gateway.calls_bind, gateway.calls_advertise, gateway.kernelspec) == ("127.0.0.1:0", None, None)


def test_a_start_request_carries_only_the_kernel_variables() -> None:
    env = {"KERNEL_MEMORY_LIMIT": "1G", "API_KEY": "secret", "IPYBOX_TOOL_TOKEN": "t", "kernel_lower": "x"}
    assert request_env(env) == {"KERNEL_MEMORY_LIMIT": "1G"}
