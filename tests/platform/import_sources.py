"""Local servers the import tests fetch from: an HTTP (or HTTPS) file server (in a thread, http.server) with scripted
answers per path (a status sequence for a flaky server, redirects, a body streamed without a length), and the
Hugging Face Hub's file API on top of it (revision -> commit, files resolved at a commit)."""

from __future__ import annotations

import hashlib
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    stream_bytes: int = 0  # > 0: send this many bytes with no Content-Length (until the client hangs up)


@dataclass
class Seen:
    path: str
    headers: dict[str, str]


class SourceServer:
    """`routes[path]` is a Reply, or a list of Replies answered in turn (the last one repeats)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.scheme = "https" if tls is not None else "http"
        self.routes: dict[str, Reply | list[Reply]] = {}
        self.seen: list[Seen] = []
        self.sent: dict[str, int] = {}  # path -> bytes of a streamed body written before the client left
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:
                owner._answer(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="source-server")

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def paths(self) -> list[str]:
        with self.lock:
            return [s.path for s in self.seen]

    def _reply_for(self, path: str) -> Reply:
        with self.lock:
            route = self.routes.get(path)
            if isinstance(route, list):
                return route.pop(0) if len(route) > 1 else route[0]
            return route if route is not None else Reply(404, b"not found")

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        with self.lock:
            self.seen.append(Seen(h.path, {k.lower(): v for k, v in h.headers.items()}))
        reply = self._reply_for(h.path)
        h.send_response(reply.status)
        for name, value in reply.headers.items():
            h.send_header(name, value)
        if reply.stream_bytes:
            h.end_headers()
            sent, chunk = 0, b"\0" * 65536
            try:
                while sent < reply.stream_bytes:
                    h.wfile.write(chunk)
                    sent += len(chunk)
            except OSError:
                pass
            with self.lock:
                self.sent[h.path] = sent
            return
        h.send_header("Content-Length", str(len(reply.body)))
        h.end_headers()
        h.wfile.write(reply.body)

    def start(self) -> SourceServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextmanager
def source_server(tls: ssl.SSLContext | None = None) -> Iterator[SourceServer]:
    server = SourceServer(tls).start()
    try:
        yield server
    finally:
        server.stop()


class HubRepo:
    """One model repository of the Hub's file API on a SourceServer: `publish(folder)` makes a commit of the
    adapter's two files and points `branch` at it (a moving branch), returning the commit."""

    def __init__(self, server: SourceServer, repo: str) -> None:
        self.server, self.repo = server, repo

    def publish(self, folder: Path, branch: str = "main") -> str:
        files = {name: (folder / name).read_bytes() for name in ("adapter_config.json", "adapter_model.safetensors")}
        commit = hashlib.sha1(b"".join(files.values())).hexdigest()
        for name, data in files.items():
            self.server.routes[f"/{self.repo}/resolve/{commit}/{name}"] = Reply(200, data, {"ETag": f'"{commit}"'})
        body = json.dumps({"id": self.repo, "sha": commit}).encode()
        self.server.routes[f"/api/models/{self.repo}/revision/{branch}"] = Reply(
            200, body, {"Content-Type": "application/json"}
        )
        return commit


def self_signed(tmp: Path, host: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A certificate for `host` made here: (the server's TLS context, a client context trusting only it)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = tmp / "cert.pem"
    key_pem = tmp / "key.pem"
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_pem, key_pem)
    client = ssl.create_default_context(cafile=str(cert_pem))
    return server, client
