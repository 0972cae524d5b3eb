"""Secrets a sandboxed kernel never sees: the routes that say where each may go, and the TLS to get there.

A kernel is given a placeholder (`ipybox-secret-github-...`) where it would have had a token. The
[DomainProxy][ipybox.sandbox.proxy.DomainProxy] puts the real value in place of the placeholder only in
HTTPS requests to the hosts that secret is for; for those hosts it terminates the kernel's TLS itself, with
certificates of a per-workspace CA that kernels are told to trust. This module holds the parts that are not
HTTP:

- [SecretRoute][ipybox.sandbox.interception.SecretRoute]: one secret, its placeholder, its hosts (exact
  names or `*.example.com`, matched as `network.allowedDomains` entries are) and the request headers it may
  be put in. It is checked when made: a value with a line break could add headers to the request it goes
  into, a short placeholder could match ordinary text. Its `repr` leaves the value out, and no message of
  this module or the proxy ever names a value.
- [InterceptionCA][ipybox.sandbox.interception.InterceptionCA]: the workspace's CA, in a directory the
  caller keeps out of every sandbox (`ca-key.pem`, 0600; `ca.pem`, 0644). EC P-256, self-signed, valid a
  year (from an hour back, for clocks a little behind) and made anew when less than 30 days are left, when
  the secret hosts change, or when the files are missing, unreadable, mismatched or the key became readable
  by others. A symlink or another user's file in their place is refused, not replaced: someone planted it.
  Its NameConstraints extension (critical) permits exactly the secret hosts, so the key, if it leaks, signs
  nothing a client accepts for any other name: `api.example.com` permits that name (and, as OpenSSL and
  every X.509 verifier read a DNS constraint, the names below it), `*.example.com` permits `.example.com`
  (only names below it: OpenSSL 3.0, Go and rustls read a leading dot that way), an IP address permits
  that address alone. A name type with no permitted entry is excluded whole (`0.0.0.0/0` and `::/0`, or
  the empty DNS name, which OpenSSL and Go read as every name): a type without any entry would otherwise be
  unconstrained. The constraints are also where the host set is kept; a certificate whose constraints
  differ from the hosts asked for is made anew. Leaf certificates (one per host, 30 days, never past the
  CA, an empty subject and a critical subject alternative name, because OpenSSL also checks a subject
  common name that looks like a host name against the DNS constraints) are made on first use and kept
  for the 64 hosts used last; they share one key that lives only in memory. Minting one takes about 2 ms
  (measured on a 2-core VM: medians of 1.8-2.6 ms over 200, about half of it loading it into OpenSSL,
  which takes certificates and keys only from files); a kept one is returned in 2 us.
- [trust_bundle][ipybox.sandbox.interception.trust_bundle] and
  [trust_env][ipybox.sandbox.interception.trust_env]: the file and the variables that make clients in a
  sandbox trust the CA on top of the machine's own CAs. Python's `ssl` (urllib, httpx, aiohttp), OpenSSL,
  Go and uv read `SSL_CERT_FILE`; requests reads `REQUESTS_CA_BUNDLE`; curl `CURL_CA_BUNDLE`; pip
  `PIP_CERT`; git `GIT_SSL_CAINFO`; Node adds `NODE_EXTRA_CA_CERTS` (the CA alone) to its own list.

Files are written atomically (a rename) with exactly the mode given, whatever the umask, never through a
link: the key first, so a crash between the two leaves a pair that does not match, which the next call
replaces. `load_or_create` holds an exclusive lock on the directory, so two processes starting at once
agree on one CA.
"""

from __future__ import annotations

import base64
import binascii
import collections
import datetime as dt
import errno
import fcntl
import importlib
import ipaddress
import logging
import os
import re
import ssl
import stat
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ipybox.errors import IpyboxError
from ipybox.safefs import NEW_FILE_FLAGS, open_dir, open_own_dir, replace_file
from ipybox.sandbox.domains import DomainFilter, covers, domain_entry_error, normalize_host

__all__ = [
    "CA_CERT_FILE",
    "CA_KEY_FILE",
    "CA_RENEW_BEFORE",
    "CA_VALIDITY",
    "LEAF_VALIDITY",
    "TRUST_ENV_VARS",
    "InterceptionCA",
    "InterceptionError",
    "SecretRoute",
    "basic_credentials",
    "trust_bundle",
    "trust_env",
    "write_ca_file",
]

logger = logging.getLogger(__name__)

CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
CA_VALIDITY = dt.timedelta(days=365)
"""How long a workspace CA is valid."""
CA_RENEW_BEFORE = dt.timedelta(days=30)
"""A workspace CA that expires within this is made anew."""
LEAF_VALIDITY = dt.timedelta(days=30)
"""How long a leaf certificate is valid (a proxy running longer mints it again, a day before it ends)."""
TRUST_ENV_VARS = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
)
"""The variables [trust_env][ipybox.sandbox.interception.trust_env] sets."""

_BACKDATE = dt.timedelta(hours=1)
_LEAF_RENEW_BEFORE = dt.timedelta(days=1)
_LEAF_CACHE_SIZE = 64
_MAX_FILE_BYTES = 1024 * 1024  # a certificate or a key is under a KiB
_MIN_PLACEHOLDER = 16
# Visible ASCII: a placeholder is a token the kernel pastes anywhere (headers, URLs, config files).
_PLACEHOLDER = re.compile(r"[\x21-\x7e]+")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")
# Control characters other than tab end a header line early or confuse its parsers.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.DOTALL)
# What marks a certificate as an ipybox interception CA: one in the machine's store (a bundle of an
# earlier run that SSL_CERT_FILE points at) is left out of a new bundle rather than trusted again.
_CA_UNIT = "secret interception"


class InterceptionError(IpyboxError, RuntimeError):
    """The interception CA or a trust bundle can't be made or used; the message says why."""


@dataclass(frozen=True)
class SecretRoute:
    """A secret and where the proxy may put it.

    Attributes:
        name: How messages name it (never its value).
        placeholder: What the kernel sees instead of the value: visible ASCII, at least 16 characters.
        value: The real value: no control characters (it goes into a header line). Left out of `repr`.
        hosts: Where it may go: host names, `*.example.com` (names below `example.com`) or IP addresses,
            normalized to lower case.
        headers: The request headers (lower case) whose values it is put in; `None`: any header. Never the
            request line or the body.

    Raises:
        ValueError: A field is malformed (the message names the secret, never its value).
    """

    name: str
    placeholder: str
    value: str = field(repr=False)
    hosts: tuple[str, ...]
    headers: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if not self.name or _CONTROL.search(self.name):
            raise ValueError(f"secret name {self.name!r}: empty or with control characters")
        if len(self.placeholder) < _MIN_PLACEHOLDER or not _PLACEHOLDER.fullmatch(self.placeholder):
            raise ValueError(
                f"secret {self.name!r}: its placeholder must be at least {_MIN_PLACEHOLDER} visible ASCII "
                "characters (a short one could match ordinary text)"
            )
        if not self.value or _CONTROL.search(self.value):
            raise ValueError(f"secret {self.name!r}: its value is empty or holds a control character")
        if self.placeholder in self.value:
            raise ValueError(f"secret {self.name!r}: its value contains its placeholder")
        if not self.hosts:
            raise ValueError(f"secret {self.name!r}: no hosts")
        for host in self.hosts:
            if (error := domain_entry_error(host)) is not None:
                raise ValueError(f"secret {self.name!r}: {error}")
        object.__setattr__(self, "hosts", tuple(dict.fromkeys(normalize_host(h) for h in self.hosts)))
        if self.headers is not None:
            names = frozenset(h.lower() for h in self.headers)
            if not names or not all(_HEADER_NAME.fullmatch(h) for h in names):
                raise ValueError(f"secret {self.name!r}: headers must be header names, or None for any")
            object.__setattr__(self, "headers", names)

    def applies_to(self, host: str) -> bool:
        """Whether `host` is one of this secret's hosts (matched as `allowedDomains` entries are)."""
        return DomainFilter(self.hosts).allows(host)

    def substitute(self, name: bytes, value: bytes) -> bytes:
        """A header's value with the placeholder replaced, where this secret may go in header `name` (lower
        case): in the value as sent, and in the credentials of `Authorization: Basic`, which carry it
        base64-encoded (git and pip send a token given as a URL's password that way)."""
        if self.headers is not None and name.decode("latin-1") not in self.headers:
            return value
        placeholder, secret = self.placeholder.encode(), self.value.encode()
        value = value.replace(placeholder, secret)
        credentials = basic_credentials(value) if name == b"authorization" else None
        if credentials is not None and placeholder in credentials:
            value = b"Basic " + base64.b64encode(credentials.replace(placeholder, secret))
        return value


def basic_credentials(value: bytes) -> bytes | None:
    """The decoded `user:password` of an `Authorization: Basic ...` value; `None` for any other value."""
    scheme, _, token = value.partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        return base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


@dataclass
class _Leaf:
    context: ssl.SSLContext
    renew_at: dt.datetime


class InterceptionCA:
    """The workspace's CA for the hosts secrets go to (see the module's description).

    Use [load_or_create][ipybox.sandbox.interception.InterceptionCA.load_or_create]; the constructor takes
    a key and certificate already checked.

    Example:
        ```python
        ca = InterceptionCA.load_or_create(state_dir / "interception", ["api.github.com"])
        context = ca.leaf_context("api.github.com")  # serves TLS as api.github.com to a kernel
        ```
    """

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, cert_path: Path) -> None:
        self._key = key
        self._cert = cert
        self.cert_path = cert_path
        """The CA certificate's file, in the CA's directory (which sandboxes do not see)."""
        hosts = _constrained_hosts(cert)
        if hosts is None:
            raise InterceptionError(f"the certificate in {cert_path} is not an ipybox interception CA")
        self.hosts: tuple[str, ...] = hosts
        """The host entries its certificates may be made for (sorted)."""
        self._hosts_filter = DomainFilter(hosts)
        # One key for every leaf, in memory only: each leaf's key would sit beside it in the same process,
        # so one per host protects nothing more, and costs a key generation per host.
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaves: collections.OrderedDict[str, _Leaf] = collections.OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def load_or_create(
        cls, directory: Path, hosts: Sequence[str], *, now: dt.datetime | None = None
    ) -> InterceptionCA:
        """The CA in `directory` (made 0700 if missing) if it is good for `hosts`, else a new one.

        Args:
            directory: Where `ca.pem` and `ca-key.pem` are kept: a directory of ipybox's state, never one a
                sandbox can read.
            hosts: The secret hosts (`SecretRoute.hosts` of every secret), in any order.
            now: The time to judge validity by (tests).

        Raises:
            ValueError: `hosts` is empty or holds an entry that is not a host name, wildcard or address.
            InterceptionError: `directory` or one of the files is a symlink, not a directory or regular
                file, or another user's.
        """
        entries = _host_entries(hosts)
        now = now or dt.datetime.now(dt.UTC)
        dir_fd = open_own_dir(directory, create=True, unsafe=InterceptionError, name="the CA directory")
        try:
            # Two processes starting at once must not each write a CA of their own (the second rename
            # would leave the first one's bundles trusting a CA nobody signs with).
            fcntl.flock(dir_fd, fcntl.LOCK_EX)
            existing, why = _read_ca(dir_fd, directory)
            if existing is not None:
                key, cert, key_mode = existing
                why = _renewal_reason(key, cert, key_mode, entries, now) or ""
                if not why:
                    return cls(key, cert, directory / CA_CERT_FILE)
            logger.info(
                "making the secret interception CA for %s in %s: %s", ", ".join(entries), directory, why
            )
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _ca_certificate(key, entries, now)
            key_pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            replace_file(dir_fd, CA_KEY_FILE, key_pem, 0o600)
            replace_file(dir_fd, CA_CERT_FILE, cert.public_bytes(serialization.Encoding.PEM), 0o644)
            return cls(key, cert, directory / CA_CERT_FILE)
        finally:
            os.close(dir_fd)  # releases the lock

    @property
    def not_after(self) -> dt.datetime:
        """When the CA expires (UTC)."""
        return self._cert.not_valid_after_utc

    def ca_pem(self) -> bytes:
        """The CA certificate, PEM."""
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def permits(self, host: str) -> bool:
        """Whether the CA may make a certificate for `host`: one of its hosts, or a name under one of its
        wildcards. An entry (`*.example.com`) is permitted when one of its hosts covers it."""
        host = normalize_host(host)
        if host.startswith("*."):
            return any(covers(entry, host) for entry in self.hosts)
        return self._hosts_filter.allows(host)

    def leaf_context(self, host: str, *, now: dt.datetime | None = None) -> ssl.SSLContext:
        """A server-side TLS context (TLS 1.2 at least, ALPN `http/1.1` only) presenting a certificate for
        `host` signed by this CA. Made on first use and kept (the 64 hosts used last); safe to call from
        any thread.

        Raises:
            ValueError: The CA may not make a certificate for `host` (not one of its hosts).
        """
        host = normalize_host(host)
        if not self.permits(host) or host.startswith("*."):
            raise ValueError(
                f"the interception CA makes certificates for {', '.join(self.hosts)}, not {host}"
            )
        now = now or dt.datetime.now(dt.UTC)
        with self._lock:
            leaf = self._leaves.get(host)
            if leaf is None or leaf.renew_at <= now:
                leaf = self._mint(host, now)
                self._leaves[host] = leaf
                while len(self._leaves) > _LEAF_CACHE_SIZE:
                    self._leaves.popitem(last=False)
            self._leaves.move_to_end(host)
            return leaf.context

    def _mint(self, host: str, now: dt.datetime) -> _Leaf:
        not_after = min(now + LEAF_VALIDITY, self.not_after)
        cert = (
            x509.CertificateBuilder()
            # An empty subject, the name in a critical subject alternative name (RFC 5280 4.2.1.6): OpenSSL
            # checks a common name that looks like a host name against the DNS constraints too, which an IP
            # address's would fail where only the address is permitted.
            .subject_name(x509.Name([]))
            .issuer_name(self._cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([_general_name(host)]), critical=True)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(digital_signature=True), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        pem = cert.public_bytes(serialization.Encoding.PEM) + self._leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # HTTP/1.1 only: the proxy reads requests one by one, and HTTP/2 would multiplex them.
        context.set_alpn_protocols(["http/1.1"])
        # OpenSSL loads a certificate and key from files only: a private directory, removed at once.
        with tempfile.TemporaryDirectory(prefix="ipybox-leaf-") as private:
            path = Path(private) / "leaf.pem"
            fd = os.open(path, NEW_FILE_FLAGS, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(pem)
            context.load_cert_chain(path)
        return _Leaf(context, not_after - _LEAF_RENEW_BEFORE)


def trust_bundle(ca: InterceptionCA, path: Path) -> Path:
    """Write the CA bundle kernels trust to `path` (0644, atomically; its directory made if missing): this
    machine's CA certificates, then the workspace CA.

    The machine's are those OpenSSL uses (`ssl.get_default_verify_paths()`: its CA file, which
    `SSL_CERT_FILE` overrides, else every certificate in its CA directory), else `certifi`'s if that is
    installed. Interception CAs among them (a bundle of an earlier run that `SSL_CERT_FILE` points at) are
    left out, and each certificate appears once.

    Returns:
        `path`.

    Raises:
        InterceptionError: No CA certificates were found on this machine (naming where it looked).
    """
    system, looked = _system_certificates()
    if not system:
        raise InterceptionError(
            "no CA certificates found on this machine to build the sandbox's trust bundle from (looked in "
            f"{', '.join(looked)}): install the system's CA certificates (e.g. ca-certificates) or certifi"
        )
    _write_public(path, b"".join(pem + b"\n" for pem in system) + ca.ca_pem())
    return path


def write_ca_file(ca: InterceptionCA, path: Path) -> Path:
    """Write the CA certificate alone to `path` (0644, atomically), for `NODE_EXTRA_CA_CERTS`, which adds
    to Node's own list (a bundle there would be read in full again at every start).

    Returns:
        `path`.
    """
    _write_public(path, ca.ca_pem())
    return path


def trust_env(bundle: Path, ca_file: Path) -> dict[str, str]:
    """The variables that make clients trust `bundle` (from `trust_bundle`) and Node add `ca_file` (from
    `write_ca_file`); paths as the sandbox sees them."""
    env = {name: str(bundle) for name in TRUST_ENV_VARS}
    env["NODE_EXTRA_CA_CERTS"] = str(ca_file)
    return env


# -- the CA's files


def _host_entries(hosts: Iterable[str]) -> tuple[str, ...]:
    entries = sorted({normalize_host(host) for host in hosts})
    if not entries:
        raise ValueError("the interception CA needs at least one host")
    for entry in entries:
        if (error := domain_entry_error(entry)) is not None:
            raise ValueError(error)
    return tuple(entries)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _general_name(host: str) -> x509.GeneralName:
    ip = _ip(host)
    return x509.IPAddress(ip) if ip is not None else x509.DNSName(host)


def _name_constraints(entries: Sequence[str]) -> x509.NameConstraints:
    permitted: list[x509.GeneralName] = []
    for entry in entries:
        ip = _ip(entry)
        if ip is not None:
            permitted.append(x509.IPAddress(ipaddress.ip_network(ip)))
        else:
            # `.example.com`: names below it only; `example.com`: it and the names below it.
            permitted.append(x509.DNSName(entry[1:] if entry.startswith("*.") else entry))
    excluded: list[x509.GeneralName] = []
    if not any(isinstance(name, x509.IPAddress) for name in permitted):
        excluded += [
            x509.IPAddress(ipaddress.ip_network("0.0.0.0/0")),
            x509.IPAddress(ipaddress.ip_network("::/0")),
        ]
    if not any(isinstance(name, x509.DNSName) for name in permitted):
        excluded.append(x509.DNSName(""))  # the empty name: every name (OpenSSL, Go)
    return x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=excluded or None)


def _constrained_hosts(cert: x509.Certificate) -> tuple[str, ...] | None:
    """The host entries a CA certificate of ours was made for (from its name constraints); `None` when it
    is not one (no CA, no constraints, or constraints of a form ipybox does not make)."""
    try:
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        constraints = cert.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return None
    if not basic.ca or basic.path_length != 0:
        return None
    entries = []
    for name in constraints.permitted_subtrees or []:
        if isinstance(name, x509.DNSName):
            entries.append(f"*{name.value}" if name.value.startswith(".") else name.value)
        elif isinstance(name, x509.IPAddress) and isinstance(
            name.value, ipaddress.IPv4Network | ipaddress.IPv6Network
        ):
            if name.value.num_addresses != 1:
                return None
            entries.append(str(name.value.network_address))
        else:
            return None
    try:
        expected = _name_constraints(_host_entries(entries))
    except ValueError:
        return None
    if set(expected.excluded_subtrees or []) != set(constraints.excluded_subtrees or []):
        return None
    return tuple(sorted(entries))


def _key_usage(*, digital_signature: bool = False, cert_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _ca_certificate(
    key: ec.EllipticCurvePrivateKey, entries: Sequence[str], now: dt.datetime
) -> x509.Certificate:
    key_id = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    # A name of its own per CA (its key's identifier): certificates are chained by issuer name, and two
    # workspaces' CAs must not be taken for one another.
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ipybox"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, _CA_UNIT),
            x509.NameAttribute(
                NameOID.COMMON_NAME, f"ipybox secret interception CA {key_id.digest[:6].hex()}"
            ),
        ]
    )
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        # RFC 5280 4.2.1.10: critical, so a verifier that can't enforce it refuses the CA rather than trust
        # it for every name.
        .add_extension(_name_constraints(entries), critical=True)
        .add_extension(key_id, critical=False)
        .sign(key, hashes.SHA256())
    )


def _renewal_reason(
    key: ec.EllipticCurvePrivateKey,
    cert: x509.Certificate,
    key_mode: int,
    entries: Sequence[str],
    now: dt.datetime,
) -> str | None:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        return "the certificate does not match the key"
    if key_mode & 0o077:
        return f"the key file became accessible to other users (mode {key_mode:04o})"
    expires = cert.not_valid_after_utc
    if expires - now < CA_RENEW_BEFORE:
        return f"it {'expired' if expires <= now else 'expires'} on {expires:%Y-%m-%d}"
    if cert.not_valid_before_utc > now:
        return f"it is valid only from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    hosts = _constrained_hosts(cert)
    if hosts is None:
        return "the certificate there is not an interception CA"
    if hosts != tuple(entries):
        return f"it was made for {', '.join(hosts)}"
    return None


def _read_ca(
    dir_fd: int, directory: Path
) -> tuple[tuple[ec.EllipticCurvePrivateKey, x509.Certificate, int] | None, str]:
    """The key, certificate and key file mode in the directory; else `None` and why not.

    Raises:
        InterceptionError: A file there is a symlink, not a regular file, or another user's.
    """
    try:
        key_data, key_mode = _read_own(dir_fd, directory, CA_KEY_FILE)
        cert_data, _ = _read_own(dir_fd, directory, CA_CERT_FILE)
    except FileNotFoundError:
        return None, "none yet"
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
        cert = x509.load_pem_x509_certificate(cert_data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        logger.warning("the interception CA in %s is unreadable (%s): making a new one", directory, e)
        return None, f"the one there is unreadable ({e})"
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        return None, "its key is not an EC P-256 key"
    return (key, cert, key_mode), ""


def _read_own(dir_fd: int, directory: Path, name: str) -> tuple[bytes, int]:
    """A regular file of this user's, its bytes and mode, opened without following a symlink."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InterceptionError(
                f"{directory / name} is a symlink: ipybox neither reads nor replaces it"
            ) from None
        if e.errno == errno.ENOENT:
            raise
        raise InterceptionError(f"cannot read {directory / name}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InterceptionError(f"{directory / name} is not a regular file")
        if info.st_uid != os.geteuid():
            raise InterceptionError(
                f"{directory / name} is owned by uid {info.st_uid}, not by this user: ipybox neither uses "
                "nor replaces it"
            )
        return file.read(_MAX_FILE_BYTES), stat.S_IMODE(info.st_mode)


def _write_public(path: Path, data: bytes) -> None:
    dir_fd = open_dir(path.parent, create_mode=0o755)
    try:
        replace_file(dir_fd, path.name, data, 0o644)
    finally:
        os.close(dir_fd)


# -- the machine's CA certificates


def _system_certificates() -> tuple[list[bytes], list[str]]:
    """The machine's CA certificates (PEM blocks, once each, without interception CAs), and where it
    looked."""
    paths = ssl.get_default_verify_paths()
    looked: list[str] = []
    sources: list[Path] = []
    if paths.cafile:
        sources.append(Path(paths.cafile))
    looked.append(paths.cafile or f"{paths.openssl_cafile} (absent)")
    if not sources and paths.capath and os.path.isdir(paths.capath):
        # A hashed directory names each certificate twice (the file and its `<hash>.0` link): dedup below.
        sources += sorted(p for p in Path(paths.capath).iterdir() if p.is_file())
    looked.append(paths.capath or f"{paths.openssl_capath} (absent)")
    blocks = _pem_blocks(sources)
    if not blocks:
        certifi = _certifi_where()
        looked.append(f"certifi ({certifi})" if certifi else "certifi (not installed)")
        if certifi is not None:
            blocks = _pem_blocks([Path(certifi)])
    return blocks, looked


def _certifi_where() -> str | None:
    try:
        module = importlib.import_module("certifi")
    except ImportError:
        return None
    where = getattr(module, "where", None)
    return str(where()) if callable(where) else None


def _pem_blocks(paths: Iterable[Path]) -> list[bytes]:
    seen: dict[bytes, None] = {}
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        for match in _PEM_CERT.finditer(data):
            block = match.group(0).replace(b"\r\n", b"\n")
            if block in seen:
                continue
            try:
                der = base64.b64decode(b"".join(block.splitlines()[1:-1]), validate=True)
            except ValueError:  # a damaged entry: OpenSSL would refuse the whole bundle for it
                continue
            if not _is_interception_ca(der):
                seen[block] = None
    return list(seen)


def _is_interception_ca(der: bytes) -> bool:
    # Cheap first: only a certificate naming our unit is parsed (a machine's store holds ~150).
    if _CA_UNIT.encode() not in der:
        return False
    try:
        subject = x509.load_der_x509_certificate(der).subject
    except ValueError:
        return False
    return any(a.value == _CA_UNIT for a in subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME))
