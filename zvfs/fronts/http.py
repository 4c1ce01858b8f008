"""`zvfs serve`: the view over HTTP, for readers that cannot mount (browsers, macOS, containers,
clusters). An ASGI application over the core's paths (core/paths.py), run by hypercorn's trio
worker; no HTTP parsing here.

- GET and HEAD of every file; one `Range` (206 with `Content-Range`; 416 past the end; several
  ranges get the whole file); `ETag` (the version and place of the bytes, core/paths.py),
  `Last-Modified`, `If-None-Match` (304), `If-Match` (412), `If-Range` with a strong ETag
  (dates never stand for a version: `App._not_modified`); exact `Content-Length`.
  An open is a snapshot: a response is all of one version, or is cut short (the connection
  closes before its `Content-Length`), never bytes of two versions.
- 404 for a file not in the tree (an absent chunk: readers use the fill value), 403 for what
  the store does not let everyone read, 400 for a path that can never name a node; a backend
  fault (502), a damaged shard (500), a shard that changed during the request, a listing that
  could not start within the store's patience or one too large for the memory budget (503)
  answers one line, with `Cache-Control: no-store`; details go to the log.
- Directories: an HTML page of links (as nginx's autoindex: what fsspec's HTTP filesystem,
  and so zarr-python listing a group over HTTP, and wget read), or JSON (`{"entries": [...]}`)
  when the client asks for it (`Accept: application/json`, `?format=json`).
- `/.zvfs/ready`, `/.zvfs/health`, `/.zvfs/metrics` (Prometheus text), `/.zvfs/stats` (JSON).
- CORS: off unless `--cors ORIGIN` (or `*`). A server on loopback is reachable by every page
  the user's browser opens, so any origin by default would let any web site read the data
  through the user's browser; viewers on another origin are named explicitly.
"""

from __future__ import annotations

import email.utils
import fcntl
import html
import itertools
import json
import logging
import os
import socket
import struct
import termios
import time
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass, field

import trio

from ..core.paths import BadPath, OpenFile, Paths, Stat
from ..errors import CorruptShardError, DirectoryTooLarge, Gone, ShardChanged, StorageError, TooManyOpen, first_time
from ..tree.nodes import ListingTooLarge

log = logging.getLogger("zvfs.http")

#: bytes read from a snapshot per body message: what a connection holds while its client reads
#: it, at most `BLOCK`, taken from the App's `sending` bytes (from the memory budget) until the
#: message is sent, at least `LEAST_BLOCK` when they are all taken. Blocks of a fixed 1 MiB held
#: ~2 MiB per slow client (890 MiB for 400 clients that never read); an even share of
#: `sending` per response, 256 KiB at most, took 400 such clients to +50 MiB under memory=64M
#: (the first ones kept their large share), these +25 MiB. 1 MiB chunk files are served 21%
#: faster to 16 clients, 29% to one (wrk, medians of 3 alternated runs of 3 s, 2026-11-27)
BLOCK, LEAST_BLOCK = 1 << 20, 16 << 10
LISTINGS_AT_ONCE = 2
#: bytes of a listing per body message, and the seconds a client may take nothing of a listing
#: once the socket's buffers are full (up to 4 MiB here), else its connection is shut and the
#: listing's slot freed (`watch_listings`): two clients that asked for a listing and never read
#: it held both slots, and every other listing was 503, for as long as they stayed connected (an
#: outside attacker). A slot must free well within the patience a listing waits for one: four
#: such clients and a listing behind them, cut after 5 s: 503; after 1-2 s: answered. "Nothing"
#: is told by the bytes the client acknowledged (the send queue, SIOCOUTQ), not by a message
#: sent in time: a message waits until the kernel frees a good part of the buffer, and clients
#: reading steadily at 40-100 KB/s were cut (a second outside attacker). (nginx's
#: `send_timeout` cuts a client that takes nothing for 60 s; its listings hold no slot.)
LISTING_MESSAGE, LISTING_STALL = 32 << 10, 1.0
LISTING_WATCH = 0.25  # seconds between looks at the listings being sent
#: seconds a client may take nothing of a listing while no other listing waits for a slot (when
#: one waits: LISTING_STALL). Over loopback a client's window opens a segment (64 KiB) at a time,
#: so one reading 40-64 KB/s showed no progress for over a second; nginx's `send_timeout`: 60 s
LISTING_IDLE = 60.0
SPECIAL = "/.zvfs/"  # the server's own endpoints (never a path of the tree: see `_special`)
_CONDITIONAL_ALLOW = "Range, If-None-Match, If-Match, If-Range"
_EXPOSE = "Content-Range, Content-Length, ETag, Last-Modified, Accept-Ranges"


@dataclass
class Counters:
    """What the HTTP front counts (with the source's figures: `/.zvfs/stats`, `/.zvfs/metrics`)."""

    requests: dict[int, int] = field(default_factory=dict)  # by status
    bytes_served: int = 0
    files_read: int = 0
    in_flight: int = 0


def _quoted(etag: str | None) -> str | None:
    return None if etag is None else f'"{etag}"'


def _matches(header: str, etag: str | None) -> bool:
    """`If-None-Match`: weak comparison over a list, or `*`."""
    if header.strip() == "*":
        return True
    if etag is None:
        return False
    wanted = _quoted(etag)
    return any(tag.strip().removeprefix("W/") == wanted for tag in header.split(","))


def _http_date(ns: int) -> str:
    return email.utils.formatdate(ns / 1e9, usegmt=True)


def byte_range(header: str, size: int) -> tuple[int, int] | None | bool:
    """One `bytes=` range as [start, stop), None to answer the whole file (no range, several
    ranges, or one that does not parse: RFC 9110 lets a server ignore them), False when
    unsatisfiable (416)."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash or not all(part.isascii() and (part.isdigit() or not part) for part in (first, last)):
        return None  # (digits only: `int` also takes `1_0`, `+5` and spaces)
    try:
        if not first:  # the last N bytes
            n = int(last)
            if n < 0:
                return None
            return (max(0, size - n), size) if n and size else False
        start = int(first)
        stop = None if not last else int(last) + 1
    except ValueError:
        return None
    if start < 0 or stop is not None and stop <= start:
        return None  # (not a valid range: ignored)
    if start >= size:
        return False
    return start, size if stop is None else min(stop, size)


def _is_connection(fd: int, ports: set[int], peer: tuple | None) -> bool:
    """Whether descriptor `fd` is a TCP connection this process accepted on one of `ports`
    (from `peer`, if given). (Outgoing connections to a store never have a listening port as
    their own; a listener has no peer.)"""
    try:
        if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
            return False
        sock = socket.socket(fileno=fd)
    except OSError:  # (closed meanwhile, or not a socket after all)
        return False
    try:
        if sock.type != socket.SOCK_STREAM or sock.getsockname()[1] not in ports:
            return False
        theirs = sock.getpeername()
        return peer is None or tuple(theirs[:2]) == tuple(peer[:2])
    except (OSError, IndexError, TypeError):  # (a listener: no peer; a Unix socket: no port)
        return False
    finally:
        sock.detach()


def _connections(ports: set[int], peer: tuple | None = None) -> list[int]:
    return [int(name) for name in os.listdir("/proc/self/fd") if _is_connection(int(name), ports, peer)]


def _unsent(fd: int) -> int | None:
    """Bytes of a connection's send queue the client has not acknowledged (SIOCOUTQ)."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return None


def shut_connections(ports: set[int], peer: tuple | None = None) -> int:
    """Shut down both ways the connections this process accepted on `ports` (from `peer`
    only, if given): how many. hypercorn 0.18 sends in a shielded scope (trio/tcp_server.py,
    `protocol_send`), so a client that stops reading holds its connection, and whatever waits
    on that send, for good; a shut-down socket fails the send (EPIPE), which hypercorn takes as
    the client gone."""
    return sum(_shut(fd) for fd in _connections(ports, peer))


def _shut(fd: int) -> bool:
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        sock.detach()


class _Cut(Exception):
    """A listing's client took nothing for too long (`watch_listings`): its connection was shut."""


async def _until_disconnect(receive, sending: trio.CancelScope) -> None:
    """Stop sending a response whose client has gone: hypercorn drops the body messages of a
    closed connection without a word, and the rest of the file was read for nobody (400
    clients gone from 32 MiB responses held the stop for the whole drain)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    sending.cancel()


class App:
    """The ASGI application. `paths`: the served source by path (public: anonymous readers);
    `cors`: origins allowed to read (`*` for any); `max_age`: seconds caches may keep a file
    without asking again (0: they ask every time, answered 304 while it is unchanged)."""

    def __init__(self, paths: Paths, cors: list[str] | None = None, max_age: int = 0, sending: int = 64 << 20,
                 worker: int = 0):
        self.paths = paths
        self.worker = worker  # (`zvfs serve --workers`: which process this is; each counts its own)
        #: bytes the bodies being sent may hold together (`BLOCK`), and how many they hold
        self.sending, self._held = sending, 0
        self.cors = list(cors or [])
        self.cache_control = f"public, max-age={max_age}" if max_age else "no-cache"
        self.counters = Counters()
        self.draining = False
        self.started = time.time()
        #: listings made at once: a listing's entries and page are made whole, and one of a
        #: directory of 2^24 chunks peaks at ~40 MiB; 48 at once took the server to 1.25 GiB
        #: under memory=64M (the cache's budget bounds what is kept, not what is being sent)
        self._listing_slots = trio.CapacityLimiter(LISTINGS_AT_ONCE)
        #: listing body messages being sent: (deadline, client, server) by listing; the
        #: listings whose connection `watch_listings` shut
        self._listing_sends: dict[int, tuple[float, tuple | None, tuple | None]] = {}
        self._listing_cut: set[int] = set()
        #: (descriptor, bytes unsent at the last look, when the client last took some) by listing
        self._listing_seen: dict[int, tuple[int, int, float]] = {}
        self._listing_keys = itertools.count()

    # -- ASGI

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        self.counters.in_flight += 1
        try:
            status = await self._handle(scope, receive, send)
        finally:
            self.counters.in_flight -= 1
        self.counters.requests[status] = self.counters.requests.get(status, 0) + 1

    async def _handle(self, scope, receive, send) -> int:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        cors = self._cors_headers(headers.get("origin"))
        method = scope["method"]
        if method == "OPTIONS":
            return await self._preflight(send, headers, cors)
        if method not in ("GET", "HEAD"):
            return await self._plain(send, 405, "read-only: GET and HEAD only", cors, [("allow", "GET, HEAD, OPTIONS")])
        path = scope["path"]
        head = method == "HEAD"
        if path.startswith(SPECIAL):
            return await self._special(send, path[len(SPECIAL):], cors, head)
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        try:
            node = await self.paths.resolve(path)
            if node.is_dir:
                return await self._listing(send, path, headers, query, cors, head, scope)
            if path.endswith("/"):  # (a file named as a directory: ENOTDIR on a filesystem)
                return await self._plain(send, 404, "not a directory", cors, head=head)
            opened = await self.paths.open_node(node, path)  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001 - every failure is an answer, never a dead server
            return await self._failure(send, e, path, cors)
        try:
            return await self._file(send, receive, opened, headers, cors, head)
        finally:
            opened.close()

    # -- files

    async def _file(self, send, receive, opened: OpenFile, headers: dict, cors: list, head: bool) -> int:
        st = opened.stat
        tag = _quoted(st.etag)
        common = [("accept-ranges", "bytes"), ("last-modified", _http_date(st.mtime_ns)),
                  ("cache-control", self.cache_control), *cors]
        if tag is not None:
            common.append(("etag", tag))
        if not self._may_use(headers.get("if-match"), tag):
            return await self._plain(send, 412, "precondition failed: this file is another version", cors,
                                     [("etag", tag)] if tag else [])
        if self._not_modified(headers, st):
            await self._start(send, 304, common)
            await send({"type": "http.response.body", "body": b""})
            return 304
        start, stop, status = 0, st.size, 200
        wanted = headers.get("range")
        if wanted is not None and self._range_applies(headers.get("if-range"), st, tag):
            found = byte_range(wanted, st.size)
            if found is False:
                return await self._plain(send, 416, "range not satisfiable", cors,
                                         [("content-range", f"bytes */{st.size}")])
            if found is not None:
                start, stop = found
                status = 206
                common.append(("content-range", f"bytes {start}-{stop - 1}/{st.size}"))
        common.append(("content-type", "application/octet-stream"))
        common.append(("content-length", str(stop - start)))
        if head:
            await self._start(send, status, common)
            await send({"type": "http.response.body", "body": b""})
            return status
        return await self._send_range(send, receive, opened, st, start, stop, status, common, cors)

    @contextmanager
    def _block(self, left: int):
        """Bytes to read for the next body message (of `left`), held in `sending` until the
        message is sent (`BLOCK`)."""
        n = min(left, max(LEAST_BLOCK, min(BLOCK, self.sending - self._held)))
        self._held += n
        try:
            yield n
        finally:
            self._held -= n

    async def _send_range(self, send, receive, opened: OpenFile, st: Stat, start: int, stop: int, status: int, common: list,
                          cors: list) -> int:
        # the first block is read before the status line: a file that cannot be read at all
        # (damaged, changed, backend down) answers an error, not a response cut short
        with self._block(stop - start) as n:
            try:
                data = await opened.read(start, n) if n else b""
            except Exception as e:  # noqa: BLE001
                return await self._failure(send, e, st.name, cors)
            self.counters.files_read += 1
            await self._start(send, status, common)
            at = start + len(data)
            try:
                await self._body(send, data, at < stop)
            except Exception as e:  # noqa: BLE001 - the status is sent: cut the response short
                self._log_failure(e)
                return 500
            data = b""  # (not held past its block)
        if at < stop:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_until_disconnect, receive, nursery.cancel_scope)
                    while at < stop:
                        with self._block(stop - at) as n:
                            data = await opened.read(at, n)
                            if not data:
                                raise ShardChanged(st.name, "ended early")
                            at += len(data)
                            await self._body(send, data, at < stop)
                            data = b""
                    nursery.cancel_scope.cancel()
            except Exception as e:  # noqa: BLE001
                self._log_failure(e)
                return 500
        return status

    async def _body(self, send, data: bytes, more: bool) -> None:
        await send({"type": "http.response.body", "body": bytes(data), "more_body": more})
        self.counters.bytes_served += len(data)

    @staticmethod
    def _not_modified(headers: dict, st: Stat) -> bool:
        """304 only for an `If-None-Match` that names this version's ETag. Dates are never
        trusted (`If-Modified-Since` is ignored): Last-Modified has whole seconds, and a shard
        rewritten within the second of a version already served kept its date (an attack got
        304 for changed content 6 times of 6, and 42-87 times in 30 s of random rewrites)."""
        inm = headers.get("if-none-match")
        return inm is not None and _matches(inm, st.etag)

    @staticmethod
    def _may_use(if_match: str | None, tag: str | None) -> bool:
        """`If-Match` (RFC 9110 13.1.1): a strong match with this version's ETag, or `*`."""
        if if_match is None or if_match.strip() == "*":
            return True
        return tag is not None and any(t.strip() == tag for t in if_match.split(","))

    @staticmethod
    def _range_applies(if_range: str | None, st: Stat, tag: str | None) -> bool:
        """`If-Range`: the range only if the client's copy is this version, which only a strong
        ETag match tells; a date never does (a rewrite within the second keeps it: an attack
        got 206 with the new version's bytes for a copy of the old one), so a date gets the
        whole file, as RFC 9110 allows."""
        if if_range is None:
            return True
        return tag is not None and if_range.strip() == tag

    # -- directories

    async def _listing(self, send, path: str, headers: dict, query: dict, cors: list, head: bool, scope: dict) -> int:
        """A listing waits for a slot at most the store's patience, then is 503 (an outside
        attacker's 40 listings of huge pages at once were answered after 8-148 s, waiting
        their turn two at a time)."""
        with trio.move_on_after(self.paths.source.store.patience) as waited:
            await self._listing_slots.acquire()
        if waited.cancelled_caught:
            return await self._plain(send, 503, "too many listings under way; ask again", cors,
                                     [("cache-control", "no-store"), ("retry-after", "1")], head)
        try:
            return await self._listing_now(send, path, headers, query, cors, head, scope)
        except _Cut:
            return 200  # (the status line was sent)
        finally:
            self._listing_slots.release()

    async def _listing_now(self, send, path: str, headers: dict, query: dict, cors: list, head: bool,
                           scope: dict) -> int:
        """The listing as JSON or HTML, streamed a page of entries at a time (`listdir_pages`:
        one page sorted whole, more in the tree's order); one page is sent with its length.
        The body goes in `LISTING_MESSAGE` pieces (`_listing_part`): a listing holds one of
        `LISTINGS_AT_ONCE` slots until it is sent, and a client that does not read must not
        hold it (`watch_listings`)."""
        key, client, server = next(self._listing_keys), scope.get("client"), scope.get("server")
        pages = self.paths.listdir_pages(path)
        try:
            first = await anext(pages)
        except Exception as e:  # noqa: BLE001
            await pages.aclose()
            return await self._failure(send, e, path, cors)
        shown = "/" + "/".join(p for p in path.split("/") if p)
        fmt = (query.get("format") or [""])[0]
        as_html = fmt == "html" or not fmt and "application/json" not in headers.get("accept", "")
        kind = "text/html; charset=utf-8" if as_html else "application/json"
        top, tail = self._html_ends(shown) if as_html else (f'{{"path": {json.dumps(shown)}, "entries": ['.encode(), b"]}")
        render = self._html_rows if as_html else self._json_rows
        try:
            body = render(shown, first)
            more = await anext(pages, None)
            if more is None:  # one page: sent whole, with its length
                whole = top + body + tail
                await self._start(send, 200, [("content-type", kind), ("content-length", str(len(whole))),
                                              ("cache-control", "no-cache"), *cors])
                if head:
                    await send({"type": "http.response.body", "body": b""})
                    return 200
                await self._listing_part(send, key, client, server, whole, last=True)
                return 200
            await self._start(send, 200, [("content-type", kind), ("cache-control", "no-cache"), *cors])
            if head:
                await send({"type": "http.response.body", "body": b""})
                return 200
            sep = b"\n" if as_html else b", "
            await self._listing_part(send, key, client, server, top + body)
            while more is not None:
                await self._listing_part(send, key, client, server, sep + render(shown, more))
                more = await anext(pages, None)
            await self._listing_part(send, key, client, server, tail, last=True)
            return 200
        finally:
            self._listing_seen.pop(key, None)
            await pages.aclose()

    async def _listing_part(self, send, key: int, client, server, data: bytes, last: bool = False) -> None:
        """`data` sent in body messages of `LISTING_MESSAGE` bytes, each registered with its
        deadline while it is being sent; `_Cut` if `watch_listings` shut the connection."""
        for at in range(0, max(len(data), 1), LISTING_MESSAGE):
            piece = data[at:at + LISTING_MESSAGE]
            self._listing_sends[key] = (trio.current_time() + LISTING_STALL, client, server)
            try:
                await send({"type": "http.response.body", "body": piece,
                            "more_body": not last or at + LISTING_MESSAGE < len(data)})
            finally:
                self._listing_sends.pop(key, None)
            if key in self._listing_cut:
                self._listing_cut.discard(key)
                raise _Cut

    async def watch_listings(self) -> None:
        """Shut the connection of a listing whose client has taken nothing for `LISTING_STALL`
        s while another listing waits for a slot, or for `LISTING_IDLE` s (looked at every
        `LISTING_WATCH` s), which frees its slot. A body message sent for longer than that has
        its connection found, and the bytes it has unsent looked at: a change since the last
        look is the client reading (half the time again after the first look)."""
        while True:
            await trio.sleep(LISTING_WATCH)
            now = trio.current_time()
            for key, (deadline, client, server) in list(self._listing_sends.items()):
                if now < deadline or client is None or server is None:
                    continue
                fd, before, since = self._listing_seen.get(key, (None, None, now))
                if fd is None or not _is_connection(fd, {server[1]}, client):
                    fd, before = next(iter(_connections({server[1]}, client)), None), None
                unsent = None if fd is None else _unsent(fd)
                if unsent is not None and unsent != before:  # (taken since the last look, or a first look)
                    self._listing_seen[key] = (fd, unsent, now)
                    self._listing_sends[key] = (now + (LISTING_STALL if before is not None else LISTING_STALL / 2),
                                                client, server)
                    continue
                if unsent is not None and not self._listing_slots.statistics().tasks_waiting and now - since < LISTING_IDLE:
                    self._listing_sends[key] = (now + LISTING_WATCH, client, server)  # (no listing waits: it may go on)
                    continue
                del self._listing_sends[key]
                self._listing_cut.add(key)
                if fd is not None:  # (checked above to be this listing's connection)
                    _shut(fd)
                if first_time("listing cut"):
                    log.warning("a listing's client took nothing for %g s while another listing waited (or %g s): "
                                "its connection was shut (logged once)", LISTING_STALL, LISTING_IDLE)

    @staticmethod
    def _json_rows(shown: str, entries: list[Stat]) -> bytes:
        return ", ".join(json.dumps({"name": e.name, "type": "directory" if e.is_dir else "file", "size": e.size,
                                     "mtime": _http_date(e.mtime_ns), "mode": f"{e.mode:04o}"}) for e in entries).encode()

    @staticmethod
    def _html_ends(shown: str) -> tuple[bytes, bytes]:
        base, title = shown.rstrip("/"), html.escape(shown)
        up = "" if shown == "/" else f'<li><a href="{html.escape(urllib.parse.quote(base.rsplit("/", 1)[0] or "/"))}">../</a></li>\n'
        return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title></head>\n"
                f"<body><h1>{title}</h1>\n<ul>\n{up}").encode(), b"\n</ul></body></html>\n"

    @staticmethod
    def _html_rows(shown: str, entries: list[Stat]) -> bytes:
        base, rows = shown.rstrip("/"), []
        for e in entries:
            name = e.name + ("/" if e.is_dir else "")
            href = urllib.parse.quote(f"{base}/{e.name}")
            size = "" if e.is_dir or e.size is None else f" ({e.size:,} bytes)"
            rows.append(f'<li><a href="{html.escape(href)}">{html.escape(name)}</a>{size}</li>')
        return "\n".join(rows).encode()

    # -- the server's own endpoints

    async def _special(self, send, name: str, cors: list, head: bool) -> int:
        if name == "health":
            return await self._plain(send, 200, "ok", cors, head=head)
        if name == "ready":
            if self.draining:
                return await self._plain(send, 503, "draining", cors, head=head)
            return await self._plain(send, 200, "ready", cors, head=head)
        if name == "stats":
            body = json.dumps(self.stats(), indent=2).encode() + b"\n"
            return await self._bytes(send, 200, body, "application/json", cors, head)
        if name == "metrics":
            from .metrics import render  # (prometheus_client: loaded when first scraped)

            body, kind = render(self)
            return await self._bytes(send, 200, body, kind, cors, head)
        return await self._plain(send, 404, "no such endpoint", cors, head=head)

    def stats(self) -> dict:
        c = self.counters
        return {**self.paths.source.stats(), "requests": {str(k): v for k, v in sorted(c.requests.items())},
                "files_read": c.files_read, "bytes_served": c.bytes_served, "in_flight": c.in_flight,
                "uptime_seconds": round(time.time() - self.started, 1), "worker": self.worker, "pid": os.getpid()}

    # -- answers

    def _cors_headers(self, origin: str | None) -> list[tuple[str, str]]:
        if not self.cors or origin is None:
            return []
        if "*" in self.cors:
            return [("access-control-allow-origin", "*"), ("access-control-expose-headers", _EXPOSE)]
        if origin in self.cors:
            return [("access-control-allow-origin", origin), ("vary", "Origin"),
                    ("access-control-expose-headers", _EXPOSE)]
        return [("vary", "Origin")]

    async def _preflight(self, send, headers: dict, cors: list) -> int:
        extra = [("allow", "GET, HEAD, OPTIONS")]
        if any(k == "access-control-allow-origin" for k, _ in cors):
            extra += [("access-control-allow-methods", "GET, HEAD, OPTIONS"),
                      ("access-control-allow-headers", _CONDITIONAL_ALLOW), ("access-control-max-age", "86400")]
            if headers.get("access-control-request-private-network") == "true":
                extra.append(("access-control-allow-private-network", "true"))
        await self._start(send, 204, [*cors, *extra])
        await send({"type": "http.response.body", "body": b""})
        return 204

    async def _failure(self, send, e: BaseException, path: str, cors: list) -> int:
        status, text = self._classify(e, path)
        return await self._plain(send, status, text, cors, [("cache-control", "no-store")])

    def _classify(self, e: BaseException, path: str) -> tuple[int, str]:
        if isinstance(e, BadPath):
            return 400, f"bad path: {e.args[-1]}"
        if isinstance(e, (FileNotFoundError, NotADirectoryError, Gone)):
            return 404, "not found"
        if isinstance(e, PermissionError):
            return 403, "not readable by everyone in the store"
        if isinstance(e, ShardChanged):
            return 503, "changed while being read; ask again"
        if isinstance(e, TooManyOpen):
            self._log_failure(e)
            return 503, "too many files open; ask again"
        if isinstance(e, CorruptShardError):
            return 500, "damaged shard"
        if isinstance(e, (DirectoryTooLarge, ListingTooLarge)):
            self._log_failure(e)
            return 503, "too large to list within the server's memory budget (now)"
        if isinstance(e, StorageError):
            self._log_failure(e)
            return 502, "the store did not answer"
        log.exception("internal error serving %s", path)
        return 500, "internal error"

    @staticmethod
    def _log_failure(e: BaseException) -> None:
        if isinstance(e, (StorageError, ShardChanged, CorruptShardError)):
            if first_time(str(e)):
                log.error("%s", e)
        else:
            log.error("response cut short: %s: %s", type(e).__name__, e)

    async def _plain(self, send, status: int, text: str, cors: list, extra: list | None = None, head: bool = False) -> int:
        return await self._bytes(send, status, (text + "\n").encode(), "text/plain; charset=utf-8", cors, head, extra)

    async def _bytes(self, send, status: int, body: bytes, kind: str, cors: list, head: bool = False,
                     extra: list | None = None) -> int:
        headers = [("content-type", kind), ("content-length", str(len(body))), *cors, *(extra or [])]
        if status >= 400 and not any(k == "cache-control" for k, _ in headers):
            headers.append(("cache-control", "no-store"))
        await self._start(send, status, headers)
        await send({"type": "http.response.body", "body": b"" if head else body})
        return status

    @staticmethod
    async def _start(send, status: int, headers: list[tuple[str, str]]) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]})
