"""`zvfs serve` as HTTP clients see it: files, ranges, validators, errors, paths that try to get
out, what the store does not let everyone read, the server's own endpoints, SIGTERM.

The store is written by zarr-python 3 (uncompressed uint8 chunks inside shards: a chunk file's
bytes are the array's values in C order, so every answer is checked against numpy slices of
the original, not against zvfs). Requests go over real sockets to the server process.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from servers import ZvfsServe

SHAPE, SHARD, CHUNK = (64, 96), (32, 32), (16, 16)


def _write(root: Path, seed: int = 1) -> np.ndarray:
    data = np.random.default_rng(seed).integers(0, 255, SHAPE, dtype=np.uint8)
    data[32:, 64:] = 0  # one shard all fill value: zarr-python writes no shard there
    g = zarr.open_group(root, mode="w", zarr_format=3)
    a = g.create_array("img", shape=SHAPE, chunks=CHUNK, shards=SHARD, dtype="uint8", compressors=None, fill_value=0)
    a[:] = data
    return data


def _chunk(data: np.ndarray, i: int, j: int) -> bytes:
    return data[i * 16:(i + 1) * 16, j * 16:(j + 1) * 16].tobytes()


@pytest.fixture(scope="module")
def served():
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="zvfs-public-", dir="/tmp"))  # (pytest's own are 0700: nothing public)
    base.chmod(0o755)
    root = base / "store.zarr"
    data = _write(root)
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("hello\n")
    (root / "private").mkdir(mode=0o700)
    (root / "private" / "secret.txt").write_text("secret\n")
    (root / "closed.txt").write_text("closed\n")
    os.chmod(root / "closed.txt", 0o600)
    os.symlink("/etc/passwd", root / "notes" / "passwd")
    try:
        with ZvfsServe(root, log=base / "serve.log") as server:
            yield server, root, data
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _get(url_or_server, path: str, headers: dict | None = None, method: str = "GET"):
    """One request with `path` sent exactly as given; (status, headers, body)."""
    url = url_or_server.url if hasattr(url_or_server, "url") else url_or_server
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_every_chunk_file_is_the_original_chunk(served):
    server, _, data = served
    for i in range(SHAPE[0] // 16):
        for j in range(SHAPE[1] // 16):
            status, headers, body = _get(server, f"/img/c/{i}/{j}")
            if i >= 2 and j >= 4:
                assert status == 404, (i, j)  # never written: readers use the fill value
                continue
            assert status == 200, (i, j, body[:100])
            assert body == _chunk(data, i, j)
            assert int(headers["content-length"]) == len(body) == 256
            assert headers["accept-ranges"] == "bytes"


def test_head_says_what_get_sends(served):
    server, _, data = served
    s1, h1, b1 = _get(server, "/img/c/1/2", method="HEAD")
    s2, h2, b2 = _get(server, "/img/c/1/2")
    assert (s1, s2) == (200, 200) and b1 == b"" and b2 == _chunk(data, 1, 2)
    for k in ("content-length", "etag", "last-modified", "content-type"):
        assert h1[k] == h2[k], k


def test_ranges_random(served):
    server, _, data = served
    rnd = random.Random(5)
    whole = _chunk(data, 0, 1)
    n = len(whole)
    for _ in range(150):
        kind = rnd.choice(["closed", "open", "suffix", "past"])
        a = rnd.randrange(0, n + 20)
        b = a + rnd.randrange(0, 300)
        spec = {"closed": f"{a}-{b}", "open": f"{a}-", "suffix": f"-{rnd.randrange(0, n + 50)}", "past": f"{n + a}-"}[kind]
        status, headers, body = _get(server, "/img/c/0/1", {"Range": f"bytes={spec}"})
        if kind == "suffix":
            k = int(spec[1:])
            if k == 0:
                assert status == 416, spec
                continue
            start, stop = max(0, n - k), n
        else:
            start = a if kind != "past" else n + a
            stop = n if kind in ("open", "past") else min(b + 1, n)
        if start >= n:
            assert status == 416 and headers["content-range"] == f"bytes */{n}", spec
            continue
        assert status == 206, spec
        assert body == whole[start:stop], spec
        assert headers["content-range"] == f"bytes {start}-{stop - 1}/{n}", spec
        assert int(headers["content-length"]) == stop - start


@pytest.mark.parametrize("spec", ["bytes=0-1,5-9", "bytes=abc", "bytes=9-2", "items=0-4", "bytes=",
                                  "bytes=1_0-20", "bytes=+1-4", "bytes=-+4", "bytes=١-٤"])
def test_ranges_that_get_the_whole_file(served, spec):
    """Ranges that do not parse as RFC 9110's digits get the whole file (`int` alone took
    `1_0` as 10: an outside attacker)."""
    server, _, data = served
    status, _, body = _get(server, "/img/c/0/0", {"Range": spec.encode().decode("latin-1")})
    assert status == 200 and body == _chunk(data, 0, 0)


def test_a_file_named_as_a_directory_is_not_found(served):
    """`/img/zarr.json/`: 404, as a filesystem says ENOTDIR (before: the file, 200)."""
    server, _, _ = served
    assert _get(server, "/img/zarr.json")[0] == 200
    assert _get(server, "/img/zarr.json/")[0] == 404
    assert _get(server, "/img/c/0/0/")[0] == 404


def test_validators(served):
    server, _, data = served
    _, h, _ = _get(server, "/img/c/0/0")
    tag, modified = h["etag"], h["last-modified"]
    assert tag.startswith('"') and tag.endswith('"')
    assert _get(server, "/img/c/0/0", {"If-None-Match": tag})[0] == 304
    assert _get(server, "/img/c/0/0", {"If-None-Match": f'"x", W/{tag}'})[0] == 304
    assert _get(server, "/img/c/0/0", {"If-None-Match": '"other"'})[0] == 200
    # dates are never trusted (whole seconds: test_dates_never_stand_for_a_version)
    assert _get(server, "/img/c/0/0", {"If-Modified-Since": modified})[0] == 200
    assert _get(server, "/img/c/0/0", {"If-Modified-Since": "Sat, 01 Jan 99999999999 00:00:00 GMT"})[0] == 200
    status, _, body = _get(server, "/img/c/0/0", {"Range": "bytes=0-9", "If-Range": tag})
    assert status == 206 and body == _chunk(data, 0, 0)[:10]
    status, _, body = _get(server, "/img/c/0/0", {"Range": "bytes=0-9", "If-Range": '"stale"'})
    assert status == 200 and body == _chunk(data, 0, 0)
    status, _, body = _get(server, "/img/c/0/0", {"Range": "bytes=0-9", "If-Range": modified})
    assert status == 200 and body == _chunk(data, 0, 0)
    assert _get(server, "/img/c/0/0", {"If-Match": tag})[0] == 200
    assert _get(server, "/img/c/0/0", {"If-Match": "*"})[0] == 200
    assert _get(server, "/img/c/0/0", {"If-Match": '"stale"', "Range": "bytes=0-9"})[0] == 412
    # chunks of one shard have one version but different places: different tags
    assert _get(server, "/img/c/0/1")[1]["etag"] != tag


def test_listings(served):
    server, _, _ = served
    status, h, body = _get(server, "/img/c/0/", {"Accept": "application/json"})
    assert status == 200 and h["content-type"] == "application/json"
    names = [e["name"] for e in json.loads(body)["entries"]]
    assert names == [str(j) for j in range(6)]
    status, h, body = _get(server, "/", {"Accept": "text/html,application/xhtml+xml"})
    assert status == 200 and h["content-type"].startswith("text/html")
    assert b'href="/img"' in body and b"zarr.json" in body
    # no preference (curl, fsspec's HTTP filesystem): links, as nginx's autoindex
    status, h, body = _get(server, "/img/c/0/", {"Accept": "*/*"})
    assert status == 200 and h["content-type"].startswith("text/html")
    assert all(f'href="/img/c/0/{j}"'.encode() in body for j in range(6))
    status, h, body = _get(server, "/img/c/0/?format=json")
    assert [e["name"] for e in json.loads(body)["entries"]] == names


def test_paths_that_try_to_get_out(served):
    server, _, _ = served
    passwd = Path("/etc/passwd").read_bytes()[:20]
    attempts = ["/../../../../etc/passwd", "/img/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/img/%2E%2E/zarr.json",
                "/img/./zarr.json", "//etc/passwd", "/img/zarr.json%00.png", "/" + "x" * 300, "/img/" + "a/" * 2100,
                "/notes/passwd", "/%2fetc%2fpasswd", "/..%2f..%2fetc%2fpasswd", "/img/c/0/0%00"]
    for path in attempts:
        status, _, body = _get(server, path)
        assert status in (400, 403, 404), (path, status)
        assert passwd not in body, path
    # the server still serves
    assert _get(server, "/img/zarr.json")[0] == 200


def test_only_what_everyone_may_read(served):
    server, _, _ = served
    assert _get(server, "/notes/readme.txt")[2] == b"hello\n"
    assert _get(server, "/private/secret.txt")[0] == 403
    assert _get(server, "/private/")[0] == 403
    assert _get(server, "/closed.txt")[0] == 403


def test_damaged_shard_is_a_short_5xx_not_cached(public_tmp):
    root = public_tmp / "store.zarr"
    _write(root)
    shard = root / "img" / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-20:] = b"\xff" * 20  # the index's crc no longer matches
    shard.write_bytes(bytes(raw))
    with ZvfsServe(root, log=public_tmp / "serve.log") as server:
        status, h, body = _get(server, "/img/c/0/0")
        assert 500 <= status < 600
        assert h["cache-control"] == "no-store"
        assert body.count(b"\n") == 1 and b"Traceback" not in body
        assert _get(server, "/img/c/0/2")[0] == 200  # other shards are served


def test_cors(served, tmp_path):
    server, root, _ = served
    _, h, _ = _get(server, "/img/zarr.json", {"Origin": "https://viewer.example"})
    assert "access-control-allow-origin" not in h  # off by default
    with ZvfsServe(root, "--cors", "https://viewer.example", log=tmp_path / "serve.log") as s2:
        _, h, _ = _get(s2, "/img/zarr.json", {"Origin": "https://viewer.example"})
        assert h["access-control-allow-origin"] == "https://viewer.example"
        assert "content-range" in h["access-control-expose-headers"].lower()
        _, h, _ = _get(s2, "/img/zarr.json", {"Origin": "https://other.example"})
        assert "access-control-allow-origin" not in h
        status, h, _ = _get(s2, "/img/c/0/0", {"Origin": "https://viewer.example", "Access-Control-Request-Method": "GET",
                                              "Access-Control-Request-Headers": "range"}, method="OPTIONS")
        assert status == 204 and "range" in h["access-control-allow-headers"].lower()


def test_endpoints(served):
    from prometheus_client.parser import text_string_to_metric_families

    server, _, _ = served
    assert _get(server, "/.zvfs/health")[0] == 200
    assert _get(server, "/.zvfs/ready")[0] == 200
    before = json.loads(_get(server, "/.zvfs/stats")[2])
    _get(server, "/img/c/0/0")
    after = json.loads(_get(server, "/.zvfs/stats")[2])
    assert after["bytes_served"] - before["bytes_served"] == 256
    status, h, body = _get(server, "/.zvfs/metrics")
    assert status == 200 and h["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    codes = {s.labels["code"]: s.value for s in families["zvfs_http_requests"].samples if s.name.endswith("_total")}
    assert codes["200"] >= 1


SCOPES = [  # (request, response) as hypercorn gives them to its logger
    ({"type": "http", "http_version": "1.1", "method": "GET", "path": "/img/c/0/0", "query_string": b"x=1",
      "headers": [(b"host", b"x"), (b"User-Agent", b"curl/8.5"), (b"referer", b"https://viewer.example/#!a")],
      "client": ("127.0.0.1", 50123), "scheme": "http"}, {"status": 206, "headers": [(b"content-length", b"17")]}),
    ({"type": "http", "http_version": "1.0", "method": "HEAD", "path": "/caf\u00e9 \"q\"", "query_string": b"",
      "headers": [], "client": None, "scheme": "http"}, {"status": 404, "headers": []}),
    ({"type": "http", "http_version": "2", "method": "GET", "path": "/", "query_string": b"",
      "headers": [(b"user-agent", b"\xff")], "client": ("/run/s",), "scheme": "https"}, None),
]


def test_access_log_line_is_hypercorns():
    """The access log writes hypercorn's own default line (`access_log_format`), built directly;
    but what the client sent is escaped as nginx escapes it (`\\xHH`: control characters, `"`,
    `\\`, bytes past ASCII), where hypercorn writes it as it is."""
    import logging
    from types import SimpleNamespace

    import trio
    from hypercorn.config import Config
    from hypercorn.logging import Logger

    from zvfs.fronts.access_log import AccessLog

    class Held(logging.Handler):
        def emit(self, record):
            theirs.append(record.getMessage())

    config = Config()
    config.accesslog = logging.getLogger("zvfs.test-access")
    config.accesslog.handlers[:] = [Held()]
    config.accesslog.propagate = False
    config.accesslog.setLevel(logging.INFO)
    held: list = []
    ours = AccessLog.logger_class(SimpleNamespace(write=held.extend))(config)
    for request, response in SCOPES:
        for _ in range(3):  # (again if the second turned between the two)
            theirs: list[str] = []
            held.clear()
            trio.run(Logger(config).access, request, response, 0.01)
            trio.run(ours.access, request, response, 0.01)
            ours.flush()
            theirs = [line.replace('\u00e9 "q"', '\\xE9 \\x22q\\x22').replace('"\u00ff"', '"\\xFF"') for line in theirs]
            if [r.getMessage() for r in held] == theirs:
                break
        assert [r.getMessage() for r in held] == theirs
        assert held[0].name == "zvfs.test-access" and held[0].levelno == logging.INFO


def test_no_request_writes_a_line_break_or_nul_into_the_access_log(served):
    """A path with `%0A` (a forged log line after it) and `%00`, and a User-Agent with quotes:
    one access log line, the path as sent, the quotes escaped (an outside attacker wrote a
    forged ERROR line into the log through a path)."""
    server, _, _ = served
    forged = "2026-11-27%2000:00:00,000%20zvfs[1]%20ERROR%20zvfs.fuse:%20FORGED"
    status, _, _ = _get(server, f"/img/zz%0A{forged}%00x", {"User-Agent": 'ua "quoted" \\'})
    assert status == 400  # (NUL in a path)
    want = f'"GET /img/zz%0A{forged}%00x 1.1" 400'
    give_up = time.monotonic() + 3
    while want not in Path(server.log).read_text():
        assert time.monotonic() < give_up, f"no access log line after 3 s: {Path(server.log).read_text()[-500:]}"
        time.sleep(0.1)
    text = Path(server.log).read_text()
    assert "\0" not in text and "FORGED" not in text.replace(forged, "")
    line = next(x for x in text.splitlines() if want in x)
    assert line.endswith('"ua \\x22quoted\\x22 \\x5C"'), line


def test_one_access_log_line_per_request_with_its_status(served):
    """Clients that close their connection right after the last byte of the response (curl, a
    one-request script) get one line each, with its status and length: hypercorn reported such a
    response as unended too, and each request had a `- -` line before its own. A client that
    leaves before its response ends still gets its `- -` line."""
    server, root, _ = served
    for k in range(20):
        status, headers, body = _get(server, "/img/zarr.json", {"User-Agent": f"one-line-{k}"})
        assert status == 200
    gone = socket.create_connection(("127.0.0.1", server.port))
    gone.sendall(b"GET /img/c/0/0 HTTP/1.1\r\nHost: x\r\nUser-Agent: left-early\r\n\r\n")
    gone.close()
    time.sleep(2.5)  # (lines are written once a second)
    lines = Path(server.log).read_text().splitlines()
    for k in range(20):
        mine = [x for x in lines if f'"one-line-{k}"' in x]
        assert len(mine) == 1 and f'" 200 {headers["content-length"]} "' in mine[0], mine
    left = [x for x in lines if '"left-early"' in x]
    assert len(left) == 1, left


def test_access_log_is_written_within_a_second(served):
    server, _, data = served
    _get(server, "/img/c/0/3", {"User-Agent": "access-test/1", "Referer": "https://r.example/"})
    want = '"GET /img/c/0/3 1.1" 200 256 "https://r.example/" "access-test/1"'
    give_up = time.monotonic() + 3
    while want not in Path(server.log).read_text():
        assert time.monotonic() < give_up, "no access log line after 3 s"
        time.sleep(0.1)
    line = next(x for x in Path(server.log).read_text().splitlines() if want in x)
    assert " INFO zvfs.access: 127.0.0.1:" in line, line


def test_sigterm_drains_requests_in_flight(public_tmp):
    root = public_tmp / "store.zarr"
    _write(root)
    big = os.urandom(48 << 20)
    (root / "big.bin").write_bytes(big)
    server = ZvfsServe(root, "--no-access-log", log=public_tmp / "serve.log").start()
    try:
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        sock.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        got = bytearray(sock.recv(1 << 16))
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        time.sleep(0.5)
        with pytest.raises(OSError):  # no new connections
            socket.create_connection(("127.0.0.1", server.port), timeout=2).recv(1)
        while True:  # the slow reader gets all of it
            part = sock.recv(1 << 20)
            if not part:
                break
            got += part
            if len(got) > len(big) and got.find(b"\r\n\r\n") > 0 and len(got) - got.find(b"\r\n\r\n") - 4 >= len(big):
                break
        head, _, body = bytes(got).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and body == big
        assert server.proc.wait(40) == 0  # type: ignore[union-attr]
    finally:
        server.stop()


def _serving_a_big_file(public_tmp, *args: str) -> ZvfsServe:
    """A server of a store holding `big.bin`, 32 MiB (started)."""
    root = public_tmp / "store.zarr"
    _write(root)
    (root / "big.bin").write_bytes(os.urandom(32 << 20))
    return ZvfsServe(root, *args, log=public_tmp / "serve.log").start()


def _stalled(server) -> socket.socket:
    """A client that asks for big.bin and does not read it."""
    s = socket.create_connection(("127.0.0.1", server.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
    return s


def test_sigterm_drain_is_bounded(public_tmp):
    """A client that never reads its large response holds the drain for `--drain` seconds, no
    longer: its connection is closed, a warning says so, exit 0."""
    server = _serving_a_big_file(public_tmp, "--drain", "1")
    try:
        stuck = _stalled(server)
        time.sleep(0.5)
        t = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert server.proc.wait(1 + 5) == 0  # type: ignore[union-attr]
        seconds = time.monotonic() - t
        assert 1 <= seconds < 1 + 3, seconds
        text = (public_tmp / "serve.log").read_text()
        assert "requests still in flight after 1 s (--drain)" in text
        assert '"GET /big.bin 1.1" - - "-" "-"' in text  # (its access log line: no response finished)
        stuck.close()
    finally:
        server.stop()


def test_a_second_sigterm_stops_without_waiting_for_the_drain(public_tmp):
    """SIGTERM drains (here for up to 30 s, a client not reading its response); a second one
    stops at once, as a second Ctrl-C would: its connection shut, exit 0 (it was ignored)."""
    server = _serving_a_big_file(public_tmp, "--drain", "30")
    try:
        stuck = _stalled(server)
        time.sleep(0.5)
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        time.sleep(1)
        assert server.proc.poll() is None  # (draining)
        t = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert server.proc.wait(10) == 0  # type: ignore[union-attr]
        assert time.monotonic() - t < 3
        assert "received SIGTERM again: shut down 1 connections without draining" in (public_tmp / "serve.log").read_text()
        stuck.close()
    finally:
        server.stop()


def _vm_kib(pid: int, field: str) -> int:
    return int(next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith(field)).split()[1])


def test_many_stalled_clients_share_the_memory_budget_and_gone_ones_cost_nothing(public_tmp):
    """400 clients ask for a 32 MiB file and never read (under memory=64M): the bodies being
    sent hold at most an eighth of the budget, past it 16 KiB each (256 KiB each took the server
    up 111 MiB; an even share of the eighth per response ~50, the first ones keeping theirs;
    now ~25); a
    client that goes away stops its response (its file was read to the end for nobody: the
    stop after they left waited the whole drain)."""
    server = _serving_a_big_file(public_tmp, "--no-access-log", "-o", "memory=64M")
    try:
        pid = server.proc.pid  # type: ignore[union-attr]
        before = _vm_kib(pid, "VmRSS")
        stalled = [_stalled(server) for _ in range(400)]
        time.sleep(2)
        assert json.loads(_get(server, "/.zvfs/stats")[2])["in_flight"] == 401
        grown = (_vm_kib(pid, "VmHWM") - before) >> 10
        assert grown < 40, f"400 stalled clients took the server up {grown} MiB under memory=64M"
        for s in stalled:
            s.close()
        time.sleep(1)
        t = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert server.proc.wait(25) == 0  # type: ignore[union-attr]
        assert time.monotonic() - t < 5
    finally:
        server.stop()


def test_slow_clients_do_not_hold_up_others(public_tmp):
    root = public_tmp / "store.zarr"
    data = _write(root)
    (root / "big.bin").write_bytes(os.urandom(32 << 20))
    with ZvfsServe(root, "--no-access-log", log=public_tmp / "serve.log") as server:
        stuck = [_stalled(server) for _ in range(16)]  # clients that ask for a large file and never read it
        time.sleep(1)
        times = []
        for k in range(50):
            t = time.monotonic()
            status, _, body = _get(server, f"/img/c/{k % 4}/{k % 4}")
            times.append(time.monotonic() - t)
            assert status == 200 and body == _chunk(data, k % 4, k % 4)
        assert sorted(times)[len(times) // 2] < 0.5, times
        for s in stuck:
            s.close()


def _established_from(port: int) -> set[int]:
    """Client ports of the connections to local `port` the kernel has established (/proc/net/tcp:
    local address, remote address, state 01)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if state == "01" and int(local.split(":")[1], 16) == port:
            found.add(int(remote.split(":")[1], 16))
    return found


def test_clients_that_never_read_a_listing_do_not_hold_up_other_listings(public_tmp):
    """Listings are made two at a time; clients that ask for a large listing and never read it
    held both slots, and every other listing was 503 for as long as they stayed connected (an
    outside attacker, 10-60 s). A client that takes nothing within the patience has its
    connection shut: other listings are answered, in every round, and the stalled clients find
    their connection closed. (40,000 names: more JSON than a socket's send and receive buffers
    hold, 4 MiB at most here; a listing that fits in them is sent whole and frees its slot.)"""
    root = public_tmp / "store.zarr"
    _write(root)
    for name, count in (("many", 40_000), ("small", 20)):
        (root / name).mkdir()
        for i in range(count):
            (root / name / f"file-with-a-longish-name-{i:06d}").touch()
    with ZvfsServe(root, "--no-access-log", log=public_tmp / "serve.log") as server:
        stalled = []
        for k in range(4):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /many/?format=json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            stalled.append(s)
        time.sleep(1)
        for _ in range(3):
            t = time.monotonic()
            status, _, body = _get(server, "/small/?format=json")
            assert status == 200 and len(json.loads(body)["entries"]) == 20
            assert time.monotonic() - t < 9
            status, _, _ = _get(server, "/img/c/0/0")
            assert status == 200
        time.sleep(3)  # (each has taken nothing for 1 s since its listing began)
        # (shut by the server: not read to their end here, as a client whose window stayed shut
        # that long may wait a minute for TCP's next probe)
        assert not {s.getsockname()[1] for s in stalled} & _established_from(server.port)
        for s in stalled:
            s.close()
        status, _, body = _get(server, "/many/?format=json")
        assert status == 200 and len(json.loads(body)["entries"]) == 40_000
        assert "its connection was shut" in (public_tmp / "serve.log").read_text()
        # a client reading steadily but slowly (about 40 KB/s) is not cut (it was, at 40-100
        # KB/s: a second outside attacker)
        slow = socket.create_connection(("127.0.0.1", server.port))
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.sendall(b"GET /many/?format=json HTTP/1.1\r\nHost: x\r\n\r\n")
        slow.settimeout(5)
        got, t = 0, time.monotonic()
        while time.monotonic() - t < 5:
            part = slow.recv(4096)
            assert part, f"cut after {got} bytes, {time.monotonic() - t:.1f} s"
            got += len(part)
            time.sleep(0.1)
        slow.close()


def test_listings_waiting_their_turn_are_answered_within_the_patience(public_tmp):
    """Ten listings at once of directories whose index pages come slowly (about 3 s each) from
    an HTTP store whose patience is 6 s: the server lists two at a time, and a listing that
    could not start within the patience is 503 with Retry-After; every request is answered
    within 11 s, each listing that was made is whole (an outside attacker: listings waiting
    their turn were answered after 8-148 s), and a listing asked afterwards is made."""
    from misbehaving_http import MisbehavingHTTP
    from concurrent.futures import ThreadPoolExecutor

    root = public_tmp / "store.zarr"
    _write(root)
    for i in range(10):
        (root / f"e{i}").mkdir()
    http = MisbehavingHTTP(public_tmp).start()
    http.endless_index, http.index_pace, http.extra = "/store.zarr/e*", 0.05, 100_000  # ~57 pieces of 50 links
    try:
        with ZvfsServe(f"{http.url}/store.zarr", "-o", "request_timeout=5,retry_deadline=1", "--no-access-log",
                       log=public_tmp / "serve.log") as server:
            def ask(i: int):
                t = time.monotonic()
                status, headers, body = _get(server, f"/e{i}/", {"Accept": "application/json"})
                return status, headers, body, time.monotonic() - t

            with ThreadPoolExecutor(10) as pool:
                answers = list(pool.map(ask, range(10)))
            status, _, after, _ = ask(0)
    finally:
        http.stop()
    print("\nten slow listings at once:", [(a[0], round(a[3], 1)) for a in answers])
    assert max(a[3] for a in answers) < 11
    assert {a[0] for a in answers} == {200, 503}
    assert all(a[1].get("retry-after") == "1" for a in answers if a[0] == 503)
    listed = [len(json.loads(a[2])["entries"]) for a in answers if a[0] == 200]
    assert listed and len(set(listed)) == 1 and listed[0] > 2000, listed
    assert status == 200 and len(json.loads(after)["entries"]) == listed[0]


def test_bad_source_and_address_exit_2(public_tmp):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "zvfs", "serve", str(public_tmp / "missing")], capture_output=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.decode().strip().splitlines()) == 1, r.stderr
    root = public_tmp / "store.zarr"
    _write(root)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "zvfs", "serve", str(root), "--listen", f"127.0.0.1:{port}"],
                           capture_output=True, timeout=60)
    assert r.returncode == 2 and b"cannot listen" in r.stderr, r.stderr


def test_a_rewritten_shard_changes_tags_never_mixes(public_tmp):
    """A shard replaced by rename: the next GET has the new bytes and a new ETag; a GET with
    the old tag in If-None-Match is no longer 304."""
    root = public_tmp / "store.zarr"
    data = _write(root)
    with ZvfsServe(root, "--no-access-log", log=public_tmp / "serve.log") as server:
        _, h, body = _get(server, "/img/c/0/0")
        assert body == _chunk(data, 0, 0)
        other_tag = _get(server, "/img/c/0/2")[1]["etag"]
        new = public_tmp / "new.zarr"
        data2 = _write(new, seed=2)
        time.sleep(0.01)
        shutil.copy(new / "img" / "c" / "0" / "0", root / "img" / "c" / "0" / "0.tmp")
        os.replace(root / "img" / "c" / "0" / "0.tmp", root / "img" / "c" / "0" / "0")
        status, h2, body2 = _get(server, "/img/c/0/0", {"If-None-Match": h["etag"]})
        assert status == 200 and body2 == _chunk(data2, 0, 0) and h2["etag"] != h["etag"]
        assert _get(server, "/img/c/0/2")[1]["etag"] == other_tag  # another shard: unchanged


def test_dates_never_stand_for_a_version(public_tmp):
    """A shard rewritten within the second of a version a client has (in place, and by
    rename; random rounds): the client's Last-Modified in If-Modified-Since never gets 304,
    and in If-Range never gets a 206 of the new bytes (the attack: 6 of 6 and 3 of 3)."""
    root = public_tmp / "store.zarr"
    versions = [_write(root, seed=1), _write(public_tmp / "v2.zarr", seed=2)]
    shards = [public_tmp / "v1", public_tmp / "v2.zarr" / "img" / "c" / "0" / "0"]
    shutil.copy(root / "img" / "c" / "0" / "0", shards[0])
    rnd = random.Random(7)
    with ZvfsServe(root, "--no-access-log", log=public_tmp / "serve.log") as server:
        for _ in range(12):
            _, h, body = _get(server, "/img/c/0/0")
            had = next(k for k in (0, 1) if body == _chunk(versions[k], 0, 0))
            other = 1 - had
            target = root / "img" / "c" / "0" / "0"
            if rnd.random() < 0.5:
                shutil.copy(shards[other], target.with_suffix(".tmp"))
                os.replace(target.with_suffix(".tmp"), target)
            else:
                target.write_bytes(shards[other].read_bytes())
            status, _, got = _get(server, "/img/c/0/0", {"If-Modified-Since": h["last-modified"]})
            assert status == 200 and got == _chunk(versions[other], 0, 0)
            status, _, got = _get(server, "/img/c/0/0", {"Range": "bytes=8-15", "If-Range": h["last-modified"]})
            assert status == 200 and got == _chunk(versions[other], 0, 0)


def test_concurrent_readers_with_a_writer_never_mix(public_tmp):
    """Readers of random chunk files while a writer replaces shards: every 200 is exactly one
    version's chunk (the old or the new), never a mix."""
    root = public_tmp / "store.zarr"
    versions = [_write(root, seed=1)]
    old, new = public_tmp / "old.zarr", public_tmp / "new.zarr"
    shutil.copytree(root, old)
    versions.append(_write(new, seed=2))
    stop = threading.Event()
    bad: list = []
    with ZvfsServe(root, "--no-access-log", log=public_tmp / "serve.log") as server:
        def reader(seed: int) -> None:
            rnd = random.Random(seed)
            while not stop.is_set():
                i, j = rnd.randrange(2), rnd.randrange(6)
                status, _, body = _get(server, f"/img/c/{i}/{j}")
                if status == 200 and body not in (_chunk(versions[0], i, j), _chunk(versions[1], i, j)):
                    bad.append((i, j))

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        rnd = random.Random(0)
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            j = rnd.randrange(3)
            src = rnd.choice([old, new]) / "img" / "c" / "0" / str(j)
            shutil.copy(src, root / "img" / "c" / "0" / f"{j}.tmp")
            os.replace(root / "img" / "c" / "0" / f"{j}.tmp", root / "img" / "c" / "0" / str(j))
            time.sleep(0.02)
        stop.set()
        for t in threads:
            t.join()
    assert not bad, bad[:10]


@pytest.fixture
def public_dir():
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="zvfs-public-", dir="/tmp"))  # (pytest's are 0700: nothing public)
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_writers_are_not_held_up_by_the_servers_leases(public_dir):
    """The server holds a read lease on each shard it reads (docs/reliability.md, the contract,
    point 1): a writer's open of the shard must go on at once (the kernel would make it wait
    45 s), and the next request gets the new bytes."""
    tmp_path = public_dir
    old = _write(tmp_path / "old.zarr", seed=1)
    new = _write(tmp_path / "new.zarr", seed=2)
    shard = tmp_path / "old.zarr/img/c/0/0"
    versions = ((tmp_path / "new.zarr/img/c/0/0").read_bytes(), new), (shard.read_bytes(), old)
    waits = []
    with ZvfsServe(tmp_path / "old.zarr", log=tmp_path / "serve.log") as server:
        for shard_bytes, data in versions * 2:
            assert _get(server, "/img/c/0/0")[0] == 200  # (the server opens the shard: a lease)
            start = time.monotonic()
            with open(shard, "r+b") as f:
                f.write(shard_bytes)
                f.truncate()
            waits.append(time.monotonic() - start)
            status, _, body = _get(server, "/img/c/0/1")
            assert status == 200 and body == _chunk(data, 0, 1)
    assert max(waits) < 5, f"a writer waited {max(waits):.1f} s for the server's lease"


def test_a_directory_narrowed_while_serving_stops_being_served(public_tmp):
    """The store's `c/` narrowed to 0700 while `zvfs serve` runs: within seconds its chunks are
    refused (anyone reads a server: only what anyone may read in the store), and served again
    once it is opened; the store root narrowed closes everything."""
    root = public_tmp / "store.zarr"
    data = _write(root)
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)

    def settles(path: str, ok: bool, within: float = 6.0) -> float:
        started = time.monotonic()
        while True:
            status, _, body = _get(server, path)
            if (status == 200 and body == _chunk(data, 0, 1)) if ok else status in (403, 404):
                return time.monotonic() - started
            assert time.monotonic() - started < within, (path, ok, status)
            time.sleep(0.2)

    with ZvfsServe(root, "--no-access-log", log=public_tmp / "serve.log") as server:
        settles("/img/c/0/1", True, 0)
        for closed in (root / "img" / "c", root):
            closed.chmod(0o700)
            settles("/img/c/0/1", False)
            closed.chmod(0o755)
            settles("/img/c/0/1", True)


def test_a_closed_row_directory_is_not_listed(public_tmp):
    """Anyone reads a server, so it serves only what anyone may read in the store: with the
    shard-row directory `img/c/0` at 0700, the JSON listings of the view's `c/0/` and `c/1/`
    (the chunks of the shards in it: two chunk rows a shard) are refused and `c/2/` still
    listed; opened while serving, `c/0/` is listed again within seconds. Before: every chunk
    name and size of the closed row."""
    root = public_tmp / "store.zarr"
    _write(root)
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    (root / "img/c/0").chmod(0o700)

    def listed(path: str):
        status, _, body = _get(server, f"{path}?format=json")
        return status, [e["name"] for e in json.loads(body)["entries"]] if status == 200 else None

    with ZvfsServe(root, "--no-access-log", log=public_tmp / "serve.log") as server:
        for row in ("/img/c/0/", "/img/c/1/"):
            status, names = listed(row)
            assert status in (403, 404) and names is None, (row, status, names)
        assert listed("/img/c/2/") == (200, ["0", "1", "2", "3"])  # (shard c/1/2 is all fill: not written)
        assert _get(server, "/img/c/0/1")[0] in (403, 404)
        (root / "img/c/0").chmod(0o755)
        started = time.monotonic()
        while listed("/img/c/0/")[0] != 200:
            assert time.monotonic() - started < 6, "c/0 opened in the store, still refused"
            time.sleep(0.2)
        assert listed("/img/c/0/") == (200, ["0", "1", "2", "3", "4", "5"])
        # closed to one user only, its owner (0055 owned by nobody): anyone may be that user
        os.chown(root / "img/c/0", 65534, -1)
        (root / "img/c/0").chmod(0o055)
        started = time.monotonic()
        while listed("/img/c/0/")[0] == 200:
            assert time.monotonic() - started < 6, "c/0 closed to its owner, still listed"
            time.sleep(0.2)
        assert _get(server, "/img/c/0/1")[0] in (403, 404)
        assert listed("/img/c/2/")[0] == 200
