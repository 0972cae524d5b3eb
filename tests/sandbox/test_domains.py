"""DomainFilter: which hosts allowedDomains/deniedDomains let through."""

from __future__ import annotations

import pytest

from ipybox.sandbox.domains import DomainFilter, domain_entry_error


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("pypi.org", True),
        ("PyPI.org.", True),
        ("evil-pypi.org", False),
        ("pypi.org.evil.com", False),
        ("files.pythonhosted.org", True),
        ("a.b.pythonhosted.org", True),
        ("pythonhosted.org", False),  # a wildcard covers subdomains only
        ("blocked.pythonhosted.org", False),  # denied wins
        ("10.0.0.1", True),
        ("10.0.0.2", False),
        ("[::1]", True),
    ],
)
def test_allows(host: str, allowed: bool) -> None:
    hosts = DomainFilter(
        ["pypi.org", "*.pythonhosted.org", "10.0.0.1", "::1"], denied=["blocked.pythonhosted.org"]
    )
    assert hosts.allows(host) is allowed


def test_nothing_is_allowed_by_default() -> None:
    assert not DomainFilter([]).allows("pypi.org")


def test_only_exact_entries_name_a_host() -> None:
    hosts = DomainFilter(["localhost", "*.example.com"])
    assert hosts.names_exactly("LOCALHOST")
    assert hosts.allows("internal.example.com") and not hosts.names_exactly("internal.example.com")


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("pypi.org", None),
        ("*.pythonhosted.org", None),
        ("127.0.0.1", None),
        ("::1", None),
        ("http://pypi.org", "without scheme, port or path"),
        ("pypi.org/simple", "without scheme, port or path"),
        ("-bad-.org", "not a valid host name"),
        ("", "not a valid host name"),
        ("*.::1", "a wildcard needs a domain"),
    ],
)
def test_entry_errors(entry: str, problem: str | None) -> None:
    error = domain_entry_error(entry)
    assert (error is None) if problem is None else (error is not None and problem in error)
