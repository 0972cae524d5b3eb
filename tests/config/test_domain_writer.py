"""`write_domain_answer`: an `always` answer about a host adds it to `[sandbox.network] allowedDomains` (or
`deniedDomains`) of `ipybox.toml` wherever the file keeps the array, the rest of the file unchanged; a file
that would still not allow the host is left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.config.domain_writer import DomainWriteError, write_domain_answer
from ipybox.config.loading import load_config

TABLE = """[sandbox]
enabled = true

[sandbox.network]
allowedDomains = ["pypi.org"]  # packages
unknown = "ask"

[kernel]
warm_pool = 1
"""


def test_an_allowed_host_is_appended_to_the_array_in_place(tmp_path: Path) -> None:
    path = tmp_path / "ipybox.toml"
    path.write_text(TABLE)
    assert write_domain_answer(tmp_path, "API.Example.com.", accept=True) == "sandbox.network.allowedDomains"
    assert path.read_text() == TABLE.replace('["pypi.org"]', '["pypi.org", "api.example.com"]')
    assert load_config(path).sandbox.network.domain_filter().allows("api.example.com")


def test_a_denied_host_goes_to_denied_domains_which_is_added(tmp_path: Path) -> None:
    path = tmp_path / "ipybox.toml"
    path.write_text('[sandbox]\nenabled = true\nnetwork = { unknown = "ask" }\n')
    write_domain_answer(path, "evil.example.com", accept=False)
    network = load_config(path).sandbox.network
    assert network.denied_domains == ["evil.example.com"] and network.unknown == "ask"


def test_a_host_the_file_would_still_not_allow_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "ipybox.toml"
    text = TABLE.replace('unknown = "ask"', 'unknown = "ask"\ndeniedDomains = ["*.example.com"]')
    path.write_text(text)
    with pytest.raises(DomainWriteError, match=r"still does not allow api\.example\.com"):
        write_domain_answer(path, "api.example.com", accept=True)
    assert path.read_text() == text
