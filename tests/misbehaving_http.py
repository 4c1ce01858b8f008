"""An HTTP server on loopback that serves a directory the way real servers go wrong (issue 10).

Modes (`server.mode`, switchable while a mount reads; `server.times` limits how many ranged
answers misbehave before it serves correctly again, None = always):

- ``ok``: correct Range support (206 with Content-Range, 416 past the end), ETag, Last-Modified
- ``ignore_range``: 200 with the whole body, as `python -m http.server`, some proxies and
  CDNs on a miss do
- ``endless200``: Range ignored, and a 200 without Content-Length whose body is the whole
  object followed by `extra` more bytes, until the client closes the connection
- ``wrong_range``: a 206 whose Content-Range and bytes are of another range than asked for
- ``short``: the announced body is cut short and the connection closed
- ``stall``: no answer for `stall` seconds
- ``redirect``: a 302 to `redirect_to` (another server, i.e. another origin) for ranged GETs
- ``long``: a right 206 (Content-Range of the range asked for) whose Content-Length announces
  `extra` more bytes, and sends them
- ``endless``: a right 206 without Content-Length whose body goes on past the range asked for
  until the client closes the connection (`extra` bytes at most, so that a client that keeps
  reading cannot take the machine's memory)
- ``gzip``: a 206 for the range asked for, `Content-Encoding: gzip` whatever the request's
  Accept-Encoding said, whose body (as long as the range) is a gzip bomb: ~1,000 times its
  size in zeros once decoded

Directory pages (index pages of links, as nginx's autoindex) are right, but for the directory
named by `endless_index` (a URL path ending in "/", or every directory below a path ending in
"*"): a page of links (to names of `name_length` digits) without Content-Length that never
ends (`extra` bytes at most), as an attacker's server could send; with `index_pace` (seconds)
it comes 50 links at a time, that long apart (a listing that lasts and takes little memory).

`extra_links` adds HTML to the index pages of the directories it names (links a real
directory could not hold: names with `/`, NUL, or over 255 bytes).

Independently, `token` requires `?token=<token>` on every request (403 otherwise) and `auth`
requires that Authorization header (401 otherwise). Every request is recorded (`seen`): path,
query, headers, so tests can check what reached which server.
"""

from __future__ import annotations

import email.utils
import html
import http.server
import os
import re
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from servers import _wait_port, free_port, serve_in_thread, stop_server


def serving_endless_dirs(store: Path, served: Path, count: int) -> MisbehavingHTTP:
    """A copy of `store` in `served`, with `count` directories `e0`, `e1`, ... whose index
    pages never end, served (started)."""
    import shutil

    shutil.copytree(store, served / store.name)
    for i in range(count):
        (served / store.name / f"e{i}").mkdir()
    server = MisbehavingHTTP(served).start()
    server.endless_index = f"/{store.name}/e*"
    return server


def listdir_errno(path: Path) -> int | None:
    """The errno of listing `path`, None if it lists."""
    try:
        os.listdir(path)
    except OSError as e:
        return e.errno
    return None


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: dict


class MisbehavingHTTP:
    def __init__(self, root: Path, mode: str = "ok", stall: float = 30.0):
        self.root = Path(root)
        self.mode = mode
        self.times: int | None = None
        self.stall = stall
        self.token: str | None = None
        self.auth: str | None = None
        self.redirect_to: str | None = None
        self.endless_index: str | None = None
        self.name_length = 9  # digits of the names an endless index page links to
        self.index_pace = 0.0  # seconds between pieces of 50 links of an endless index page (0: at once)
        self.extra_links: dict[str, str] = {}  # URL path of a directory -> HTML put on its index page
        self.extra = 1 << 30  # bytes past the range asked for, in modes long and endless
        self._bombs: dict[int, bytes] = {}
        self.port = free_port()
        self.seen: list[Seen] = []
        self.misbehaved = 0
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _endless(self, path: str) -> bool:
        """`path` is the directory `endless_index` names, or below it when it ends in "*"."""
        e = self.endless_index
        return e is not None and (path == e or e.endswith("*") and path.startswith(e[:-1]))

    def set(self, mode: str, times: int | None = None) -> None:
        with self._lock:
            self.mode, self.times, self.misbehaved = mode, times, 0

    def _misbehave(self) -> str:
        """The mode for this ranged answer (counting down `times`)."""
        with self._lock:
            if self.mode == "ok" or (self.times is not None and self.misbehaved >= self.times):
                return "ok"
            self.misbehaved += 1
            return self.mode

    def start(self) -> MisbehavingHTTP:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._answer(head=True)

            def do_GET(self):
                self._answer(head=False)

            def _send(self, status: int, headers: dict, body: bytes = b"", head: bool = False) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _answer(self, head: bool) -> None:
                parts = urlsplit(self.path)
                with server._lock:
                    server.seen.append(Seen(self.command, parts.path, parts.query, dict(self.headers.items())))
                if server.token is not None and parse_qs(parts.query).get("token") != [server.token]:
                    return self._send(403, {}, b"token required", head)
                if server.auth is not None and self.headers.get("Authorization") != server.auth:
                    return self._send(401, {"WWW-Authenticate": 'Basic realm="zvfs"'}, b"", head)
                path = server.root / unquote(parts.path).lstrip("/")
                if path.is_dir() and server._endless(parts.path) and not head:
                    return self._endless_index()
                if path.is_dir():
                    links = "".join(f'<a href="{quote(p.name)}{"/" if p.is_dir() else ""}">{html.escape(p.name)}</a>\n'
                                    for p in sorted(path.iterdir())) + server.extra_links.get(parts.path, "")
                    return self._send(200, {"Content-Type": "text/html"}, links.encode(), head)
                if not path.is_file():
                    return self._send(404, {}, b"", head)
                data = path.read_bytes()
                st = os.stat(path)
                meta = {"ETag": f'"{st.st_mtime_ns:x}-{st.st_size:x}"', "Accept-Ranges": "bytes",
                        "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
                        "Content-Type": "application/octet-stream"}
                wanted = self.headers.get("Range")
                if head:
                    return self._send(200, {**meta, "Content-Length": str(len(data))}, b"", True)
                if not wanted:
                    return self._send(200, meta, data)
                mode = server._misbehave()
                if mode == "stall":
                    time.sleep(server.stall)
                    self.close_connection = True
                    return
                if mode == "redirect":
                    return self._send(302, {"Location": f"{server.redirect_to}{self.path}"})
                if mode == "ignore_range":
                    return self._send(200, meta, data)
                if mode == "endless200":
                    return self._too_much(mode, meta, data)
                first, last = _parse_range(wanted, len(data))
                if first >= len(data):
                    return self._send(416, {**meta, "Content-Range": f"bytes */{len(data)}"})
                if mode == "wrong_range":  # another range than asked for, consistently labelled
                    shift = max(1, (last - first + 1) // 2)
                    first, last = first + shift, min(len(data) - 1, last + shift)
                body = data[first:last + 1]
                headers = {**meta, "Content-Range": f"bytes {first}-{last}/{len(data)}"}
                if mode in ("long", "endless", "gzip"):
                    return self._too_much(mode, headers, body)
                if mode == "short":
                    self.send_response(206)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self._send(206, headers, body)

            def _endless_index(self) -> None:
                self.close_connection = True
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                try:
                    sent, n = 0, 0
                    step = 50 if server.index_pace else 20000
                    while sent < server.extra:
                        page = "".join(f'<a href="f{i:0{server.name_length}d}">f{i:09d}</a>\n'
                                       for i in range(n, n + step)).encode()
                        self.wfile.write(page)
                        sent, n = sent + len(page), n + step
                        if server.index_pace:
                            self.wfile.flush()
                            time.sleep(server.index_pace)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _too_much(self, mode: str, headers: dict, body: bytes) -> None:
                self.close_connection = True
                self.send_response(200 if mode == "endless200" else 206)
                for k, v in headers.items():
                    self.send_header(k, v)
                if mode == "gzip":
                    self.send_header("Content-Encoding", "gzip")
                    body = server._bomb(len(body))
                if mode not in ("endless", "endless200"):
                    self.send_header("Content-Length", str(len(body) + (server.extra if mode == "long" else 0)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                    if mode != "gzip":
                        zeros, sent = bytes(1 << 20), 0
                        while sent < server.extra:
                            self.wfile.write(zeros[: server.extra - sent])
                            sent += len(zeros)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading: what it should do

        self._server = serve_in_thread(self.port, Handler)
        return self

    def _bomb(self, size: int) -> bytes:
        """`size` bytes of a gzip stream of zeros (the stream is cut there, unfinished)."""
        with self._lock:
            if size not in self._bombs:
                z = zlib.compressobj(9, zlib.DEFLATED, 31)
                zeros, out, got = bytes(1 << 20), [], 0
                while got < size:
                    part = z.compress(zeros)
                    out.append(part)
                    got += len(part)
                self._bombs[size] = b"".join(out)[:size]
            return self._bombs[size]

    def stop(self) -> None:
        stop_server(self._server)


def _parse_range(value: str, size: int) -> tuple[int, int]:
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", value.strip())
    if not m or (not m.group(1) and not m.group(2)):
        return 0, size - 1
    if not m.group(1):  # suffix
        return max(0, size - int(m.group(2))), size - 1
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) else size - 1
    return first, min(last, size - 1)


class FaultTCP:
    """A TCP proxy to `target_port` for servers whose requests must reach them unchanged (S3:
    signed headers; servers.FaultProxy forwards only a few headers, which moto refuses). While
    `fault` is set, every new connection gets it: "stall" (the request is never answered),
    "reset" (closed at once), "503" (an HTTP 503 answer), "longer" (the server's answer to
    the first request, its headers and body unchanged but for Content-Length, which is
    dropped, followed by `extra` more bytes and the end of the connection: a body longer than
    asked for, signatures intact). Setting a fault also drops the connections that were open,
    so pooled keep-alive connections cannot bypass it."""

    def __init__(self, target_port: int, extra: int = 1 << 30):
        self.target_port = target_port
        self.extra = extra
        self.port = free_port()
        self.fault: str | None = None
        self.injected = 0
        self._open: set = set()
        self._loop = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, fault: str | None) -> None:
        import asyncio

        def apply():
            self.fault = fault
            for w in list(self._open):
                w.close()

        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self._loop).result()
        self._loop.call_soon_threadsafe(apply)
        time.sleep(0.05)

    async def _pipe(self, reader, writer) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # the other side went away: the finally closes ours
        finally:
            writer.close()

    async def _handle(self, creader, cwriter) -> None:
        import asyncio
        import socket
        import struct

        fault = self.fault
        if fault is not None:
            self.injected += 1
            if fault == "longer":
                return await self._longer(creader, cwriter)
            if fault == "reset":
                sock = cwriter.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                cwriter.close()
                return
            try:
                await creader.readuntil(b"\r\n\r\n")
                if fault == "503":
                    cwriter.write(b"HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    await cwriter.drain()
                else:  # stall: hold the connection until the client gives up
                    await creader.read()
            except (ConnectionError, OSError, EOFError):
                pass  # the client gave up: that is what a stall is for
            cwriter.close()
            return
        try:
            sreader, swriter = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cwriter.close()
            return
        self._open.update((cwriter, swriter))
        try:
            await asyncio.gather(self._pipe(creader, swriter), self._pipe(sreader, cwriter))
        finally:
            self._open.difference_update((cwriter, swriter))

    async def _longer(self, creader, cwriter) -> None:
        import asyncio

        try:
            request = await creader.readuntil(b"\r\n\r\n")  # (the GETs of reads carry no body)
            sreader, swriter = await asyncio.open_connection("127.0.0.1", self.target_port)
            swriter.write(request)
            await swriter.drain()
            status, *fields = (await sreader.readuntil(b"\r\n\r\n")).split(b"\r\n")
            length = next(int(f.split(b":", 1)[1]) for f in fields if f.lower().startswith(b"content-length:"))
            keep = [f for f in fields if f and not f.lower().startswith((b"content-length:", b"connection:"))]
            cwriter.write(b"\r\n".join([status, *keep, b"Connection: close", b"", b""]) + await sreader.readexactly(length))
            swriter.close()
            zeros, sent = bytes(1 << 20), 0
            while sent < self.extra:
                cwriter.write(zeros[: self.extra - sent])
                await cwriter.drain()
                sent += len(zeros)
        except (ConnectionError, OSError, EOFError, asyncio.IncompleteReadError):
            pass  # the client stopped reading: what it should do
        cwriter.close()

    def _run(self) -> None:
        import asyncio

        self._loop = asyncio.new_event_loop()
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(self._loop)  # connections still piping: ended while the loop runs
            for task in tasks:
                task.cancel()

            async def ended() -> None:
                await asyncio.gather(*tasks, return_exceptions=True)

            self._loop.run_until_complete(ended())
            self._loop.close()

    def start(self) -> FaultTCP:
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(10)
        _wait_port(self.port)
        return self

    def stop(self) -> None:
        if self._loop:
            self._loop.call_soon_threadsafe(self._loop.stop)
