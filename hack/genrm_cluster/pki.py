"""A throw-away PKI for one local control plane.

Why our own: kube-apiserver insists on TLS and client-certificate auth is the simplest credential
the components, kubectl, kopf and the Python client all understand. Everything lives for one
cluster run (validity 7 days) and is written as PEM files into the cluster's work dir.
ECDSA P-256 keys keep generation in the milliseconds on a busy 2-core machine; kube-apiserver
accepts them for serving, client auth and ServiceAccount token signing (ES256).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=7)

#: SANs of the apiserver serving certificate: loopback and the in-cluster names (`serving_cert` adds
#: the `kubernetes` Service's address), so clients configured either way verify the certificate.
APISERVER_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
APISERVER_IPS = ("127.0.0.1",)


@dataclass(frozen=True)
class CertPair:
    """Paths of a PEM certificate and its private key."""

    cert: Path
    key: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


class PKI:
    """A CA plus the leaf certificates and the ServiceAccount signing keypair of one cluster."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._ca_key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        self._not_before = now - datetime.timedelta(minutes=5)
        ca_name = _name("genrm-cluster-ca")
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True,
                    crl_sign=True, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = CertPair(directory / "ca.crt", directory / "ca.key")
        self.ca.cert.write_bytes(self._ca_cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self._ca_key, self.ca.key)

    def _issue(
        self,
        name: str,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName] | None = None,
    ) -> CertPair:
        key = _new_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_before + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        pair = CertPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair

    def serving_cert(self, name: str, common_name: str, service_ip: str) -> CertPair:
        """The apiserver's serving certificate (loopback and in-cluster SANs, ``service_ip`` the
        `kubernetes` Service's ClusterIP, which in-cluster clients dial)."""
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in APISERVER_DNS_NAMES]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in (*APISERVER_IPS, service_ip)]
        return self._issue(name, _name(common_name), ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def client_cert(self, name: str, user: str, groups: tuple[str, ...] = ()) -> CertPair:
        """A client certificate: the apiserver maps CN to the user and O to its groups."""
        return self._issue(name, _name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH)

    def service_account_keys(self) -> CertPair:
        """The ServiceAccount token signing keypair; `cert` holds the public key (PEM)."""
        key = _new_key()
        pair = CertPair(self.directory / "sa.pub", self.directory / "sa.key")
        pair.cert.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        _write_key(key, pair.key)
        return pair
