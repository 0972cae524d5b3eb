"""The call channel's certificate (`ipybox.tool_server.tls`) and where its TLS listener binds
(`RemoteCalls`): pure logic and files, no processes."""

from __future__ import annotations

import datetime as dt
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ipybox.in_kernel.tool_runner import ToolRunner, ToolRunnerError
from ipybox.tool_server.remote_calls import RemoteCalls, format_address, split_host_port
from ipybox.tool_server.tls import (
    CertificateError,
    ChannelCertificate,
    load_certificate,
    renewal_reason,
    workspace_certificate,
)
from ipybox.tool_server.tool_server import ToolServer

NOW = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)


def read_cert(certificate: ChannelCertificate) -> x509.Certificate:
    return x509.load_pem_x509_certificate(certificate.cert_path.read_bytes())


def alt_names(cert: x509.Certificate) -> set[str]:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(name.value) for name in names}


# --- the workspace's own certificate ---------------------------------------------------------------------


def test_a_workspace_certificate_names_the_advertised_host_and_loopback_and_its_key_is_private(
    tmp_path: Path,
) -> None:
    certificate = workspace_certificate(tmp_path / "tls", "tools.example", now=NOW)
    cert = read_cert(certificate)
    assert alt_names(cert) == {"tools.example", "127.0.0.1", "::1", "localhost"}
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    assert cert.not_valid_after_utc - NOW == dt.timedelta(days=365)
    assert certificate.cert_pem == cert.public_bytes(serialization.Encoding.PEM).decode()
    assert certificate.fingerprint == cert.fingerprint(hashes.SHA256()).hex()
    assert stat.S_IMODE(certificate.key_path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "tls").stat().st_mode) == 0o700
    assert not [p for p in (tmp_path / "tls").iterdir() if p.name.startswith(".")]  # no temporary left


def test_an_ip_address_is_named_as_one(tmp_path: Path) -> None:
    cert = read_cert(workspace_certificate(tmp_path, "10.1.2.3", now=NOW))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.1.2.3") in names.get_values_for_type(x509.IPAddress)
    assert "10.1.2.3" not in names.get_values_for_type(x509.DNSName)


def test_the_certificate_is_reused_while_good_and_made_anew_when_the_advertised_host_changes(
    tmp_path: Path,
) -> None:
    first = workspace_certificate(tmp_path, "10.0.0.5", now=NOW)
    again = workspace_certificate(tmp_path, "10.0.0.5", now=NOW + dt.timedelta(days=100))
    assert again.fingerprint == first.fingerprint
    assert workspace_certificate(tmp_path, "127.0.0.1", now=NOW).fingerprint == first.fingerprint  # named too
    moved = workspace_certificate(tmp_path, "10.0.0.6", now=NOW)
    assert moved.fingerprint != first.fingerprint
    assert "10.0.0.6" in alt_names(read_cert(moved))
    assert stat.S_IMODE(moved.key_path.stat().st_mode) == 0o600


def test_a_certificate_expiring_within_30_days_is_made_anew(tmp_path: Path) -> None:
    first = workspace_certificate(tmp_path, "h.example", now=NOW)
    kept = workspace_certificate(tmp_path, "h.example", now=NOW + dt.timedelta(days=334))
    renewed = workspace_certificate(tmp_path, "h.example", now=NOW + dt.timedelta(days=336))
    assert kept.fingerprint == first.fingerprint
    assert renewed.fingerprint != first.fingerprint
    assert renewed.not_after == NOW + dt.timedelta(days=336 + 365)


def test_a_key_file_opened_to_others_or_replaced_gets_a_new_certificate(tmp_path: Path) -> None:
    first = workspace_certificate(tmp_path, "h.example", now=NOW)
    first.key_path.chmod(0o644)
    second = workspace_certificate(tmp_path, "h.example", now=NOW)
    assert second.fingerprint != first.fingerprint
    assert stat.S_IMODE(second.key_path.stat().st_mode) == 0o600
    # A crash between the key's write and the certificate's leaves a pair that does not match.
    other = ec.generate_private_key(ec.SECP256R1())
    second.key_path.write_bytes(
        other.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    third = workspace_certificate(tmp_path, "h.example", now=NOW)
    assert third.fingerprint != second.fingerprint
    assert load_certificate(third.cert_path, third.key_path, now=NOW) == third


def test_garbage_or_a_symlink_in_place_of_the_files_is_replaced_not_followed(tmp_path: Path) -> None:
    directory = tmp_path / "tls"
    directory.mkdir(mode=0o700)
    (directory / "cert.pem").write_text("not a certificate")
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    (directory / "key.pem").symlink_to(target)
    certificate = workspace_certificate(directory, "h.example", now=NOW)
    assert target.read_text() == "untouched"
    assert not certificate.key_path.is_symlink()
    assert load_certificate(certificate.cert_path, certificate.key_path, now=NOW).fingerprint == (
        certificate.fingerprint
    )


def test_a_certificate_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "tls").symlink_to(tmp_path / "real")
    with pytest.raises(CertificateError, match=r"certificate directory .* is a symlink"):
        workspace_certificate(tmp_path / "tls", "h.example")


@pytest.mark.parametrize("host", ["", "a b", "http://x", "x/y", "-"])
def test_an_advertised_host_that_is_no_name_or_address_is_refused(tmp_path: Path, host: str) -> None:
    with pytest.raises(ValueError, match="advertised host must be an IP address or a DNS name"):
        workspace_certificate(tmp_path, host)


def test_renewal_reasons_say_what_is_wrong(tmp_path: Path) -> None:
    certificate = workspace_certificate(tmp_path, "h.example", now=NOW)
    cert = read_cert(certificate)
    key = serialization.load_pem_private_key(certificate.key_path.read_bytes(), password=None)
    assert renewal_reason(cert, key, "h.example", NOW) is None
    assert renewal_reason(cert, key, "H.EXAMPLE.", NOW) is None  # DNS names compare without case
    assert renewal_reason(cert, key, "other.example", NOW) == "it does not name 'other.example'"
    assert renewal_reason(cert, key, "h.example", NOW + dt.timedelta(days=400)) == "it expired on 2027-12-07"
    assert renewal_reason(cert, key, "h.example", NOW, key_mode=0o640) == (
        "its key file is accessible to other users (mode 0640)"
    )
    assert renewal_reason(cert, ec.generate_private_key(ec.SECP256R1()), "h.example", NOW) == (
        "it does not match its key"
    )


# --- a certificate the user provides ---------------------------------------------------------------------


def test_a_users_certificate_and_key_are_loaded_with_its_chain_served_and_the_leaf_pinned(
    tmp_path: Path,
) -> None:
    own = workspace_certificate(tmp_path / "own", "h.example", now=NOW)
    chained = tmp_path / "chain.pem"
    other = workspace_certificate(tmp_path / "other", "x.example", now=NOW)
    chained.write_text(own.cert_pem + other.cert_pem)
    loaded = load_certificate(chained, own.key_path, now=NOW)
    assert loaded.cert_pem == own.cert_pem
    assert loaded.fingerprint == own.fingerprint
    assert loaded.cert_path == chained


def test_unusable_user_files_are_refused_naming_the_file(tmp_path: Path) -> None:
    good = workspace_certificate(tmp_path / "good", "h.example", now=NOW)
    other = workspace_certificate(tmp_path / "other", "h.example", now=NOW)
    missing = tmp_path / "missing.pem"
    with pytest.raises(CertificateError, match=f"cannot read the certificate file {missing}"):
        load_certificate(missing, good.key_path)
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(CertificateError, match=f"the certificate file {junk} holds no PEM certificate"):
        load_certificate(junk, good.key_path)
    with pytest.raises(CertificateError, match=f"the key file {junk} holds no PEM private key"):
        load_certificate(good.cert_path, junk)
    with pytest.raises(
        CertificateError, match=f"the key in {other.key_path} is not the key of the certificate"
    ):
        load_certificate(good.cert_path, other.key_path)
    key = serialization.load_pem_private_key(good.key_path.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(CertificateError, match=f"the key file {encrypted} is encrypted"):
        load_certificate(good.cert_path, encrypted)
    with pytest.raises(CertificateError, match=f"the certificate in {good.cert_path} expired on 2027-12-07"):
        load_certificate(good.cert_path, good.key_path, now=NOW + dt.timedelta(days=366))


# --- where the TLS listener binds ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.5:8765", ("10.0.0.5", 8765)),
        ("tools.example", ("tools.example", None)),
        ("[::1]:443", ("::1", 443)),
        ("::1", ("::1", None)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
    ],
)
def test_addresses_are_split_into_host_and_port(text: str, expected: tuple[str, int | None]) -> None:
    assert split_host_port(text, "x") == expected


@pytest.mark.parametrize("text", ["", ":80", "h:port", "h:70000", "[::1", "[::1]x", "a b:1", "user@h:1"])
def test_malformed_addresses_are_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(ValueError, match=r"RemoteCalls\.bind must be HOST:PORT"):
        split_host_port(text, "RemoteCalls.bind")


def test_ipv6_addresses_are_bracketed() -> None:
    assert format_address("tls", "::1", 5) == "tls://[::1]:5"
    assert format_address("tls", "h.example", 5) == "tls://h.example:5"


@pytest.mark.parametrize("bind", ["0.0.0.0:9000", "10.0.0.5:0", "127.0.0.1:0"])
def test_a_tcp_listener_without_tls_is_refused_there_is_no_plain_tcp_mode(bind: str) -> None:
    with pytest.raises(ValueError, match="only with TLS, it has no plain-TCP mode"):
        RemoteCalls(bind=bind, advertise="h.example", certificate=None)  # type: ignore[arg-type]


def test_a_plain_tcp_tool_server_beyond_loopback_is_refused() -> None:
    with pytest.raises(ValueError, match="loopback only"):
        ToolServer(host="0.0.0.0", port=9000)


def test_the_listener_binds_loopback_by_default_and_advertises_what_it_binds(tmp_path: Path) -> None:
    certificate = workspace_certificate(tmp_path, "127.0.0.1")
    remote = RemoteCalls(certificate=certificate)
    assert (remote.bind_host, remote.bind_port) == ("127.0.0.1", 0)
    assert (remote.advertise_host, remote.advertise_port) == ("127.0.0.1", None)
    cluster = RemoteCalls(certificate=certificate, bind="0.0.0.0:8765", advertise="ipybox.ns.svc:443")
    assert (cluster.advertise_host, cluster.advertise_port) == ("ipybox.ns.svc", 443)


def test_a_wildcard_bind_needs_an_address_to_advertise(tmp_path: Path) -> None:
    certificate = workspace_certificate(tmp_path, "127.0.0.1")
    with pytest.raises(ValueError, match="listens on every interface: say which address kernels dial"):
        RemoteCalls(certificate=certificate, bind="[::]:8765")


def test_a_tool_server_with_remote_calls_is_constructed_complete(tmp_path: Path) -> None:
    remote = RemoteCalls(certificate=workspace_certificate(tmp_path, "127.0.0.1"))
    server = ToolServer(remote=remote)
    assert server.remote is remote
    assert server.remote_certificate_pem == remote.certificate.cert_pem
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.remote_address
    with pytest.raises(RuntimeError, match="only with remote=RemoteCalls"):
        _ = ToolServer().remote_address


# --- the kernel's side, before any connection ------------------------------------------------------------


def test_a_tls_address_without_a_pinned_certificate_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IPYBOX_TOOL_CERT", raising=False)
    runner = ToolRunner("x", address="tls://127.0.0.1:9", token="t")
    with pytest.raises(ToolRunnerError, match="IPYBOX_TOOL_CERT is not set"):
        runner.run_sync("t", {})


def test_a_pinned_certificate_that_is_no_pem_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IPYBOX_TOOL_CERT", "garbage")
    with pytest.raises(ToolRunnerError, match="IPYBOX_TOOL_CERT does not hold a PEM certificate"):
        ToolRunner("x", address="tls://127.0.0.1:9", token="t").run_sync("t", {})
