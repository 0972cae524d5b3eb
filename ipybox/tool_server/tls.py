"""The call channel's TLS certificate: the one a workspace makes for itself, or one the user provides.

Kernels that reach the host over the network (a remote gateway's) dial the call channel's `tls://`
listener and pin its certificate: they are given its PEM (`IPYBOX_TOOL_CERT`) and accept exactly that
certificate, whoever signed it and whatever name it carries (see `ipybox.in_kernel.tool_runner`). So the
certificate needs no CA, and its names serve other clients only (`openssl s_client`, a health check).

- [workspace_certificate][ipybox.tool_server.tls.workspace_certificate]: the workspace's own, in a
  directory of its state (`cert.pem`, and `key.pem` with mode 0600): EC P-256, self-signed, valid for a
  year (from an hour before it was made, for clocks a little behind), its subject alternative names the
  advertised host (a DNS name or an IP address) plus `127.0.0.1`, `::1` and `localhost`. It is kept while
  it is good, and made anew when it is missing or unreadable, expires within 30 days, no longer names the
  advertised host, does not match its key, or its key file became readable by others. A new certificate
  is a new pin: kernels bootstrapped with the old one can no longer call (new kernels get the new one).
  Each file is replaced atomically (a rename), the key first: a crash between the two leaves a
  certificate that does not match its key, which the next call replaces.
- [load_certificate][ipybox.tool_server.tls.load_certificate]: a pair the user provides (PEM; the
  certificate file may carry its chain after the certificate itself, which is what kernels pin). A file
  that cannot be read, holds no PEM certificate or key, an encrypted key, a key of another certificate, or
  an expired certificate is a [CertificateError][ipybox.tool_server.tls.CertificateError] naming the file.

Both give a [ChannelCertificate][ipybox.tool_server.tls.ChannelCertificate], which
[CallChannel.listen_tls][ipybox.tool_server.call_channel.CallChannel.listen_tls] serves with.
"""

from __future__ import annotations

import datetime as dt
import errno
import ipaddress
import logging
import os
import re
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes, PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ipybox.errors import IpyboxError
from ipybox.safefs import open_own_dir, replace_file

__all__ = [
    "CERT_FILE",
    "KEY_FILE",
    "RENEW_BEFORE",
    "VALIDITY",
    "CertificateError",
    "ChannelCertificate",
    "covers",
    "load_certificate",
    "renewal_reason",
    "workspace_certificate",
]

logger = logging.getLogger(__name__)

CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"
VALIDITY = dt.timedelta(days=365)
"""How long a workspace certificate is valid."""
RENEW_BEFORE = dt.timedelta(days=30)
"""A workspace certificate that expires within this is made anew."""
_BACKDATE = dt.timedelta(hours=1)
_LOOPBACK = ("127.0.0.1", "::1", "localhost")
# A DNS name (labels of letters, digits, hyphens), as an advertised host may be; IPs are checked apart.
_DNS_NAME = re.compile(
    r"(?=.{1,253}$)([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.)*[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.?"
)
_MAX_FILE_BYTES = 1024 * 1024  # a certificate chain or a key is a few KiB


class CertificateError(IpyboxError, ValueError):
    """A certificate or key for the call channel cannot be used. The message names the file and why."""


@dataclass(frozen=True)
class ChannelCertificate:
    """A certificate the call channel's TLS listener presents, and its key.

    Attributes:
        cert_pem: The certificate itself (PEM, without any chain): what kernels pin (`IPYBOX_TOOL_CERT`).
        cert_path: The file the listener presents: the certificate, and the user's chain after it if any.
        key_path: Its private key (PEM, unencrypted).
        fingerprint: SHA-256 of the certificate's DER form, lowercase hex: what the kernel compares.
        not_after: When it expires (UTC).
    """

    cert_pem: str
    cert_path: Path
    key_path: Path
    fingerprint: str
    not_after: dt.datetime

    def server_context(self) -> ssl.SSLContext:
        """A server-side TLS context (TLS 1.2 at least) presenting this certificate.

        Raises:
            CertificateError: The files can no longer be loaded (naming them).
        """
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # Kernels keep their connection and never resume a session: no session tickets, so an idle TLS
        # 1.3 connection holds no unread record the kernel could take for the channel closing it.
        context.num_tickets = 0
        context.options |= ssl.OP_NO_TICKET
        try:
            context.load_cert_chain(self.cert_path, self.key_path)
        except (OSError, ssl.SSLError) as e:
            raise CertificateError(
                f"cannot serve TLS with the certificate {self.cert_path} and the key {self.key_path}: {e}"
            ) from None
        return context


def covers(cert: x509.Certificate, host: str) -> bool:
    """Whether `cert` names `host` (an IP address, or a DNS name compared without case) among its subject
    alternative names."""
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    ip = _ip(host)
    if ip is not None:
        return ip in names.get_values_for_type(x509.IPAddress)
    wanted = host.rstrip(".").lower()
    return any(name.rstrip(".").lower() == wanted for name in names.get_values_for_type(x509.DNSName))


def renewal_reason(
    cert: x509.Certificate, key: PrivateKeyTypes, host: str, now: dt.datetime, *, key_mode: int = 0o600
) -> str | None:
    """Why the workspace certificate `cert` (with `key`, whose file has mode `key_mode`) must be made anew
    for the advertised `host` at `now`; `None` when it is good."""
    if not _matches(cert, key):
        return "it does not match its key"
    if key_mode & 0o077:
        return f"its key file is accessible to other users (mode {key_mode:04o})"
    expires = cert.not_valid_after_utc
    if expires - now < RENEW_BEFORE:
        return f"it {'expired' if expires <= now else 'expires'} on {expires:%Y-%m-%d}"
    if cert.not_valid_before_utc > now:
        return f"it is valid only from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    if not covers(cert, host):
        return f"it does not name {host!r}"
    return None


def workspace_certificate(
    directory: Path, host: str, *, now: dt.datetime | None = None
) -> ChannelCertificate:
    """The workspace's certificate for the advertised `host`, in `directory` (made 0700 if missing):
    the one there if it is still good, else a new one (see the module's description).

    Raises:
        ValueError: `host` is neither an IP address nor a DNS name.
        CertificateError: `directory` is a symlink, not a directory, or another user's.
    """
    host = _advertised_host(host)
    now = now or dt.datetime.now(dt.UTC)
    dir_fd = open_own_dir(directory, create=True, unsafe=CertificateError, name="the certificate directory")
    try:
        existing, why = _read_pair(dir_fd, directory)
        if existing is not None:
            cert, key, key_mode = existing
            renew = renewal_reason(cert, key, host, now, key_mode=key_mode)
            if renew is None:
                return _channel_certificate(cert, directory / CERT_FILE, directory / KEY_FILE)
            why = renew
        logger.info("making the call channel's TLS certificate for %s in %s: %s", host, directory, why)
        new_key = ec.generate_private_key(ec.SECP256R1())
        cert = _self_signed(new_key, host, now)
        key_pem = new_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        replace_file(dir_fd, KEY_FILE, key_pem, 0o600)
        replace_file(dir_fd, CERT_FILE, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    finally:
        os.close(dir_fd)
    return _channel_certificate(cert, directory / CERT_FILE, directory / KEY_FILE)


def load_certificate(
    cert_file: Path, key_file: Path, *, now: dt.datetime | None = None
) -> ChannelCertificate:
    """The user's certificate and key, checked to be usable.

    Raises:
        CertificateError: Naming the file that cannot be used and why.
    """
    cert_data = _read_user_file(cert_file, "certificate")
    try:
        cert = x509.load_pem_x509_certificates(cert_data)[0]
    except ValueError as e:
        raise CertificateError(
            f"the certificate file {cert_file} holds no PEM certificate "
            f"('-----BEGIN CERTIFICATE-----' ...): {e}"
        ) from None
    key_data = _read_user_file(key_file, "key")
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
    except TypeError:
        raise CertificateError(
            f"the key file {key_file} is encrypted: ipybox needs the key unencrypted (protect the file by its "
            "permissions instead, chmod 600)"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as e:
        raise CertificateError(
            f"the key file {key_file} holds no PEM private key ('-----BEGIN PRIVATE KEY-----' ...): {e}"
        ) from None
    if not _matches(cert, key):
        raise CertificateError(f"the key in {key_file} is not the key of the certificate in {cert_file}")
    now = now or dt.datetime.now(dt.UTC)
    if cert.not_valid_after_utc <= now:
        raise CertificateError(
            f"the certificate in {cert_file} expired on {cert.not_valid_after_utc:%Y-%m-%d}: renew it"
        )
    certificate = _channel_certificate(cert, cert_file, key_file)
    certificate.server_context()  # what OpenSSL refuses (a key type it cannot serve with) is refused now
    return certificate


# -- helpers


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _advertised_host(host: str) -> str:
    ip = _ip(host)
    if ip is not None:
        return str(ip)
    if not _DNS_NAME.fullmatch(host):
        raise ValueError(f"the advertised host must be an IP address or a DNS name, not {host!r}")
    return host


def _matches(cert: x509.Certificate, key: PrivateKeyTypes) -> bool:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    try:
        return bool(cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki))
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return False


def _channel_certificate(cert: x509.Certificate, cert_path: Path, key_path: Path) -> ChannelCertificate:
    return ChannelCertificate(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
        cert_path=cert_path,
        key_path=key_path,
        fingerprint=cert.fingerprint(hashes.SHA256()).hex(),
        not_after=cert.not_valid_after_utc,
    )


def _self_signed(key: CertificateIssuerPrivateKeyTypes, host: str, now: dt.datetime) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ipybox tool server")])
    alt_names: list[x509.GeneralName] = []
    for each in (host, *_LOOPBACK):
        ip = _ip(each)
        entry: x509.GeneralName = x509.IPAddress(ip) if ip is not None else x509.DNSName(each)
        if entry not in alt_names:
            alt_names.append(entry)
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return builder.sign(key, hashes.SHA256())


def _read_pair(
    dir_fd: int, directory: Path
) -> tuple[tuple[x509.Certificate, PrivateKeyTypes, int] | None, str]:
    """The certificate, key and key file mode in the directory; else `None` and why not."""
    try:
        cert_data, _ = _read_at(dir_fd, CERT_FILE)
        key_data, key_mode = _read_at(dir_fd, KEY_FILE)
    except FileNotFoundError:
        return None, "none yet"
    except OSError as e:
        return None, f"the one there cannot be read ({e})"
    try:
        cert = x509.load_pem_x509_certificate(cert_data)
        key = serialization.load_pem_private_key(key_data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        logger.warning(
            "the call channel's certificate in %s is unreadable (%s): making a new one", directory, e
        )
        return None, f"the one there is unreadable ({e})"
    return (cert, key, key_mode), ""


def _read_at(dir_fd: int, name: str) -> tuple[bytes, int]:
    """A regular file's bytes and mode, opened in `dir_fd` without following a symlink."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_FILE_BYTES:
            raise OSError(errno.EINVAL, f"{name} is not a regular file of at most {_MAX_FILE_BYTES} bytes")
        return file.read(), stat.S_IMODE(info.st_mode)


def _read_user_file(path: Path, what: str) -> bytes:
    try:
        with open(path, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise CertificateError(f"the {what} file {path} is not a regular file")
            data = file.read(_MAX_FILE_BYTES + 1)
    except OSError as e:
        raise CertificateError(f"cannot read the {what} file {path}: {e.strerror or e}") from None
    if len(data) > _MAX_FILE_BYTES:
        raise CertificateError(
            f"the {what} file {path} is larger than {_MAX_FILE_BYTES} bytes: not a PEM file"
        )
    return data
