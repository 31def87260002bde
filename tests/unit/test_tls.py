"""TLS settings: the server context (handshakes run in memory) and the flags that choose it."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from tests.certificates import Pki, make_pki
from tritium.cli import parse_config
from tritium.tls import TlsError, TlsSettings, server_context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _client(pki: Pki, alpn: list[str], cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.set_alpn_protocols(alpn)
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return context


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[ssl.SSLObject, bytes]:
    """Both sides of a TLS connection over memory buffers; returns the client's side and what
    the server read after the handshake (a client certificate is judged by then in TLS 1.3)."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    tls_client = client.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    tls_server = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, side in (("client", tls_client), ("server", tls_server)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            s_in.write(c_out.read())
            c_in.write(s_out.read())
    tls_client.write(b"ping")
    s_in.write(c_out.read())
    return tls_client, tls_server.read(4)


def test_grpc_context_selects_h2(pki: Pki) -> None:
    server = server_context(TlsSettings(pki.server_cert, pki.server_key), ["h2"])
    client, received = _handshake(server, _client(pki, ["h2", "http/1.1"]))
    assert client.selected_alpn_protocol() == "h2"
    assert received == b"ping"
    assert client.version() in ("TLSv1.2", "TLSv1.3")


def test_mutual_tls_admits_a_client_certificate_from_the_root(pki: Pki) -> None:
    settings = TlsSettings(pki.server_cert, pki.server_key, pki.ca, mutual=True)
    server = server_context(settings, ["h2"])
    _, received = _handshake(server, _client(pki, ["h2"], (pki.client_cert, pki.client_key)))
    assert received == b"ping"


@pytest.mark.parametrize("stranger", [False, True], ids=["no-certificate", "other-ca"])
def test_mutual_tls_refuses_other_clients(pki: Pki, stranger: bool) -> None:
    settings = TlsSettings(pki.server_cert, pki.server_key, pki.ca, mutual=True)
    server = server_context(settings, ["h2"])
    cert = (pki.stranger_cert, pki.stranger_key) if stranger else None
    with pytest.raises(ssl.SSLError):
        _handshake(server, _client(pki, ["h2"], cert))


def test_bad_files_are_reported_by_name(pki: Pki, tmp_path: Path) -> None:
    missing = tmp_path / "absent.pem"
    with pytest.raises(TlsError, match=f"cannot read server certificate '{missing}'"):
        server_context(TlsSettings(missing, pki.server_key), [])
    with pytest.raises(TlsError, match="key values mismatch"):
        server_context(TlsSettings(pki.server_cert, pki.client_key), [])
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(TlsError, match=f"root certificate '{garbage}'"):
        server_context(TlsSettings(pki.server_cert, pki.server_key, garbage, mutual=True), [])
    with pytest.raises(TlsError, match="mutual TLS needs a root certificate"):
        server_context(TlsSettings(pki.server_cert, pki.server_key, None, mutual=True), [])


# -- flags ------------------------------------------------------------------------------------


def _files(pki: Pki, proto: str, key: Path | None = None) -> list[str]:
    return [f"--{proto}-server-cert", str(pki.server_cert),
            f"--{proto}-server-key", str(key or pki.server_key),
            f"--{proto}-root-cert", str(pki.ca)]


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_tls_flags_fill_the_config(pki: Pki, proto: str) -> None:
    plain = parse_config(["serve", *_files(pki, proto)])
    assert getattr(plain, f"{proto}_tls") is None  # file flags alone, as tritonserver: no TLS
    tls = parse_config(["serve", f"--{proto}-use-ssl", "true", *_files(pki, proto)])
    assert getattr(tls, f"{proto}_tls") == TlsSettings(pki.server_cert, pki.server_key, pki.ca)
    mutual = parse_config(["serve", f"--{proto}-use-ssl-mutual", "true", *_files(pki, proto)])
    assert getattr(mutual, f"{proto}_tls").mutual is True
    other = "http" if proto == "grpc" else "grpc"
    assert getattr(mutual, f"{other}_tls") is None


@pytest.mark.parametrize(("proto", "args", "fragment"), [
    ("grpc", [], "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
    ("http", ["--http-server-cert", "/no/such/cert.pem", "--http-server-key", "/no/key.pem"],
     "--http-use-ssl: cannot read server certificate '/no/such/cert.pem'"),
    ("grpc", ["mismatched"], "key values mismatch"),
])
def test_bad_tls_flags_stop_startup_in_one_line(pki: Pki, proto: str, args: list[str],
                                                fragment: str) -> None:
    if args == ["mismatched"]:
        args = _files(pki, proto, key=pki.client_key)
    with pytest.raises(SystemExit) as stopped:
        parse_config(["serve", f"--{proto}-use-ssl", "true", *args])
    message = str(stopped.value)
    assert message.startswith("tritium: error: ") and "\n" not in message
    assert fragment in message
