"""TLS for a listener: the files it uses, and the server-side ``ssl.SSLContext`` from them."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path


class TlsError(Exception):
    """A TLS setting that cannot be used; the message names the file and the reason."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """PEM files for one listener; ``mutual`` requires and verifies a client certificate
    issued under ``root_cert``."""

    server_cert: Path
    server_key: Path
    root_cert: Path | None = None
    mutual: bool = False


def server_context(settings: TlsSettings, alpn: list[str]) -> ssl.SSLContext:
    """A TLS 1.2+ server context offering ``alpn`` (gRPC needs ``h2``: its clients refuse a
    server that selects no protocol)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(alpn)
    _load_chain(context, settings)
    if settings.mutual:
        # Only the given root is trusted, never the system's store: mutual TLS admits the
        # clients this deployment issued certificates to, not anyone with a public one.
        if settings.root_cert is None:
            raise TlsError("mutual TLS needs a root certificate to verify clients with")
        _readable(settings.root_cert, "root certificate")
        try:
            context.load_verify_locations(cafile=str(settings.root_cert))
        except ssl.SSLError as exc:
            raise TlsError(f"root certificate '{settings.root_cert}': {_reason(exc)}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _load_chain(context: ssl.SSLContext, settings: TlsSettings) -> None:
    _readable(settings.server_cert, "server certificate")
    _readable(settings.server_key, "server key")
    try:
        context.load_cert_chain(str(settings.server_cert), str(settings.server_key))
    except ssl.SSLError as exc:
        raise TlsError(f"server certificate '{settings.server_cert}' and key "
                       f"'{settings.server_key}': {_reason(exc)}") from None


def _readable(path: Path, what: str) -> None:
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise TlsError(f"cannot read {what} '{path}': {exc.strerror}") from None


def _reason(exc: ssl.SSLError) -> str:
    # "key values mismatch" reads better than "[X509: KEY_VALUES_MISMATCH] key values
    # mismatch (_ssl.c:4041)".
    reason = exc.reason or ""
    return reason.lower().replace("_", " ") if reason else str(exc)
