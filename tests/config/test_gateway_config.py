"""`[kernel.gateway]` and `[endpoints.calls]`: kernels on a remote Enterprise Gateway. What applies to local
kernels only is refused at its key when written out with a gateway, never silently not applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.config import ConfigError, load_config

GATEWAY = '[kernel.gateway]\nurl = "https://eg.example.com:8888/"\ntoken = "${EG_TOKEN}"\n'


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "ipybox.toml").write_text(text)
    return tmp_path


def test_a_gateway_is_read_with_its_defaults_and_the_url_without_its_trailing_slash(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GATEWAY))
    gateway = config.kernel.gateway
    assert gateway is not None
    assert gateway.url == "https://eg.example.com:8888"
    assert gateway.token == "${EG_TOKEN}"  # filled when kernels start, not when the file is read
    assert (gateway.kernelspec, gateway.ca_file, gateway.start_timeout) == ("python3", None, 300)
    assert config.endpoints.calls.bind == "127.0.0.1:0"  # loopback unless configured


def test_without_a_gateway_kernels_are_local(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")).kernel.gateway is None


@pytest.mark.parametrize(
    ("text", "place", "says"),
    [
        ('[kernel.gateway]\nurl = "eg:8888"\n', "ipybox.toml:2:1", "not a gateway URL"),
        ('[kernel.gateway]\nurl = "ftp://eg/"\n', "ipybox.toml:2:1", "not a gateway URL"),
        ("[kernel.gateway]\nkernelspec = 'python3'\n", "ipybox.toml:1:9", "url"),
        (GATEWAY + "[sandbox]\nenabled = true\n", "ipybox.toml:5:1", "isolates them"),
        (GATEWAY + "[kernel.limits]\nprocesses = 64\n", "ipybox.toml:5:1", "remove processes"),
        (GATEWAY + '[kernel.limits]\ntmp = "1GiB"\n', "ipybox.toml:5:1", "remove tmp"),
        ('[endpoints.calls]\nbind = "0.0.0.0"\n', "ipybox.toml:2:1", "'host:port'"),
        ('[endpoints.calls]\ncert = "c.pem"\n', "ipybox.toml", "cert and key go together"),
        ('[endpoints.calls]\nbind = "0.0.0.0:7450"\n', "ipybox.toml", "no address to dial"),
    ],
    ids=["no-scheme", "not-http", "no-url", "sandbox", "processes", "tmp", "bind", "cert-alone", "wildcard"],
)
def test_what_a_gateway_cannot_have_is_one_error_at_its_key(
    tmp_path: Path, text: str, place: str, says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    message = str(caught.value)
    assert place in message and says in message, message
    assert "Traceback" not in message


def test_memory_and_cpus_go_to_the_gateway_and_the_local_sandbox_may_be_turned_off(tmp_path: Path) -> None:
    text = GATEWAY + '[kernel.limits]\nmemory = "2GiB"\ncpus = 1.5\n[sandbox]\nenabled = false\n'
    config = load_config(write(tmp_path, text))
    assert config.kernel.limits.memory == 2 * 1024**3 and config.kernel.limits.cpus == 1.5


def test_a_public_bind_with_its_advertised_name_and_own_certificate_is_accepted(tmp_path: Path) -> None:
    text = GATEWAY + (
        '[endpoints.calls]\nbind = "0.0.0.0:7450"\nadvertise = "tools.ipybox.svc:7450"\n'
        'cert = "c.pem"\nkey = "c.key"\n'
    )
    calls = load_config(write(tmp_path, text)).endpoints.calls
    assert (calls.bind, calls.advertise, calls.cert, calls.key) == (
        "0.0.0.0:7450",
        "tools.ipybox.svc:7450",
        "c.pem",
        "c.key",
    )
