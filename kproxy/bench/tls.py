"""A TLS test bed made of real parts: certificates from `openssl`, a broker behind HAProxy.

Neither embedded broker serves TLS here (Tansu 0.6's `--cert` and `--key`
conflict; noida-db's Kafka listener is plaintext), so the TLS broker is the
embedded Tansu broker behind HAProxy terminating TLS, with the broker
advertising HAProxy's address as a broker behind a TLS terminator does
(docs/security.md). The tests and `kproxy bench --tls` use it; the same
HAProxy, originating TLS as well, is the reference path the TLS cost is
measured against.

Certificates are made with the `openssl` command (Debian's, on every
machine with HAProxy): a CA, leaves signed by it, and a second CA that
signs nothing, for the wrong-CA case.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kproxy.bench.reference import HAPROXY_GLOBALS, haproxy_binary, running_haproxy
from kproxy.brokers import BrokerError, free_port, start_broker

DAYS = "2"
_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Leaf:
    cert: Path
    key: Path

    @property
    def combined(self) -> Path:
        """Certificate and key in one file, as HAProxy's `crt` wants them."""
        path = self.cert.with_suffix(".combined.pem")
        path.write_text(self.cert.read_text() + self.key.read_text())
        return path


@dataclass(frozen=True)
class Pki:
    ca: Path
    # A CA that signed none of the leaves: verifying against it must fail.
    other_ca: Path
    # Names only `localhost`: reached as 127.0.0.1 its name does not match.
    broker: Leaf
    # localhost and 127.0.0.1: what kproxy's listeners present.
    proxy: Leaf
    # A client certificate (mutual TLS), signed by `ca`.
    client: Leaf
    # Names localhost, but signed by `other_ca`: a broker kproxy must not trust.
    impostor: Leaf


def _openssl(*args: str, cwd: Path) -> None:
    try:
        result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise BrokerError("certificates for TLS are made with openssl: install Debian's openssl package") from None
    if result.returncode != 0:
        raise BrokerError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()}")


def _make_ca(work: Path, name: str) -> tuple[Path, Path]:
    cert, key = work / f"{name}.pem", work / f"{name}.key"
    _openssl(
        "req", "-x509", *_EC, "-keyout", key.name, "-out", cert.name, "-days", DAYS, "-subj", f"/CN=kproxy {name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=work,
    )
    return cert, key


def _make_leaf(work: Path, name: str, ca: tuple[Path, Path], alt_names: str, usage: str) -> Leaf:
    cert, key, csr, ext = (work / f"{name}{suffix}" for suffix in (".pem", ".key", ".csr", ".ext"))
    ext.write_text(
        f"subjectAltName={alt_names}\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        f"extendedKeyUsage={usage}\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    _openssl("req", *_EC, "-keyout", key.name, "-out", csr.name, "-subj", f"/CN={name}", cwd=work)
    _openssl(
        "x509", "-req", "-in", csr.name, "-CA", ca[0].name, "-CAkey", ca[1].name, "-CAcreateserial",
        "-out", cert.name, "-days", DAYS, "-extfile", ext.name, cwd=work,
    )
    return Leaf(cert, key)


def make_pki(work: Path) -> Pki:
    """A fresh CA and leaves in `work` (about a second of openssl)."""
    work.mkdir(parents=True, exist_ok=True)
    ca = _make_ca(work, "ca")
    other_ca = _make_ca(work, "other-ca")
    return Pki(
        ca=ca[0],
        other_ca=other_ca[0],
        broker=_make_leaf(work, "broker", ca, "DNS:localhost", "serverAuth"),
        proxy=_make_leaf(work, "proxy", ca, "DNS:localhost,IP:127.0.0.1", "serverAuth"),
        client=_make_leaf(work, "client", ca, "DNS:kproxy-client", "clientAuth"),
        impostor=_make_leaf(work, "impostor", other_ca, "DNS:localhost", "serverAuth"),
    )


TLS_TERMINATOR_CONFIG = HAPROXY_GLOBALS + """\
frontend kafka_tls
    bind {host}:{port} ssl crt {crt}{verify}
    # Only a client that names the broker as it advertises itself (SNI) reaches it:
    # every connection through kproxy then shows that kproxy sends that name.
    use_backend broker if {{ ssl_fc_sni -m str localhost }}
frontend kafka_impostor
    bind {host}:{impostor_port} ssl crt {impostor_crt}
    default_backend broker
backend broker
    server broker {host}:{broker_port}
"""


@dataclass(frozen=True)
class TlsBroker:
    """A broker reached only over TLS, at `bootstrap` (localhost:PORT, as its certificate names it)."""

    bootstrap: str
    port: int
    plain_bootstrap: str  # the broker itself, behind the terminator (setup only: it advertises the TLS port)
    # The same broker behind a certificate from another CA (localhost:PORT).
    impostor_bootstrap: str


@contextlib.contextmanager
def tls_broker(
    work: Path, pki: Pki, *, require_client_cert: bool = False, host: str = "127.0.0.1",
    advertise: tuple[str, int] | None = None,
) -> Iterator[TlsBroker]:
    """The embedded broker behind HAProxy terminating TLS with `pki.broker`'s certificate.

    The broker advertises the terminator (as localhost, the name its certificate
    carries), or `advertise` when something else stands in front of it.
    """
    haproxy_binary()  # missing: fail before the broker starts
    port, impostor_port = free_port(host), free_port(host)
    advertise_host, advertise_port = advertise or ("localhost", port)
    broker = start_broker(host, advertise=advertise_host, advertise_port=advertise_port,
                          log_path=work / f"broker-tls-{port}.log")
    try:
        config = work / f"haproxy-tls-{port}.cfg"
        verify = f" ca-file {pki.ca} verify required" if require_client_cert else ""
        config.write_text(
            TLS_TERMINATOR_CONFIG.format(host=host, port=port, crt=pki.broker.combined, verify=verify,
                                         impostor_port=impostor_port, impostor_crt=pki.impostor.combined,
                                         broker_port=broker.port)
        )
        with running_haproxy(config, work / f"haproxy-tls-{port}.log", host, [port, impostor_port]):
            yield TlsBroker(f"localhost:{port}", port, broker.bootstrap, f"localhost:{impostor_port}")
    finally:
        broker.stop()


# The reference path of `kproxy bench --tls`: HAProxy ending the client's TLS
# and opening its own to the broker's terminator, verified as kproxy verifies.
TLS_REFERENCE_CONFIG = HAPROXY_GLOBALS + """\
frontend reference
    bind {host}:{port} ssl crt {crt}
    default_backend terminator
backend terminator
    server terminator {host}:{terminator_port} ssl verify required ca-file {ca} sni str(localhost) verifyhost localhost
"""


@contextlib.contextmanager
def haproxy_tls_path(work: Path, pki: Pki, host: str = "127.0.0.1") -> Iterator[str]:
    """A second TLS broker, reached through HAProxy doing TLS on both sides; yields the bootstrap clients use.

    Clients -> HAProxy (TLS, `pki.proxy`) -> HAProxy terminator (TLS, `pki.broker`) -> broker, which
    advertises the first HAProxy: the same hops, and the same two TLS sessions, as through kproxy.
    """
    port = free_port(host)
    with tls_broker(work, pki, host=host, advertise=(host, port)) as terminated:
        config = work / f"haproxy-tls-reference-{port}.cfg"
        config.write_text(TLS_REFERENCE_CONFIG.format(host=host, port=port, crt=pki.proxy.combined, ca=pki.ca,
                                                      terminator_port=terminated.port))
        with running_haproxy(config, work / f"haproxy-tls-reference-{port}.log", host, [port]):
            yield f"{host}:{port}"
