"""A store that stops answering costs the files it holds, within a bound, never the directory
they are in (issue 22). The kernel serves the lookups of one directory one at a time (libfuse
< 3.17 does not ask for FUSE_PARALLEL_DIROPS: zvfs/fronts/fuse_daemon.py), and a lookup of a
chunk file needs its shard's index, so one lookup that waits holds all the others behind it.
Before: 16 readers of one directory of a stalled HTTP store ended after 2.1 to 33.4 s (the
bound is 3 s: each lookup waited for a whole deadline in turn), and a shard on a hung
filesystem froze every lookup of its directory for good (the readers in D state).

Real mounts; the Zarr v3 store is written by zarr-python (one directory of 16 chunk files from
4 shards), served by tests/misbehaving_http.py, or local with tests/hung_file.py (a FUSE
filesystem whose one file never opens) mounted over one shard.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ZVFS, force_unmount, is_mounted, zvfs_mount
from misbehaving_http import MisbehavingHTTP

from zvfs.fronts.fuse_daemon import STOP_GRACE
from zvfs.storage.base import STALL_PATIENCE

pytestmark = pytest.mark.mount

C = 16  # chunk side; the array is one row of 16 chunks, 4 per shard
REQUEST_TIMEOUT, RETRY_DEADLINE = 1, 2
BOUND = REQUEST_TIMEOUT + RETRY_DEADLINE


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, np.ndarray]:
    import zarr

    root = tmp_path_factory.mktemp("stalls") / "store.zarr"
    group = zarr.open_group(root, mode="w", zarr_format=3)
    a = group.create_array("a", shape=(C, 16 * C), chunks=(C, C), shards=(C, 4 * C), dtype="uint8",
                           compressors=None, fill_value=0)
    data = np.random.default_rng(22).integers(1, 255, size=a.shape, dtype="uint8")
    a[...] = data
    return root, data


def chunk(data: np.ndarray, j: int) -> bytes:
    return data[:, j * C:(j + 1) * C].tobytes()


def read_or_errno(path: Path) -> bytes | int:
    try:
        return path.read_bytes()
    except OSError as e:
        return e.errno


def test_lookups_queued_in_one_directory_each_end_within_the_deadline(store, tmp_path):
    """16 readers open the 16 chunk files of one directory at once while the server stalls on
    every ranged GET: each gets EIO within retry_deadline + request_timeout (+ 1.5 s), counted
    from its own open, not from the end of the lookups queued before it; once the server
    answers again, every file reads right within seconds (failures are remembered briefly)."""
    root, data = store
    server = MisbehavingHTTP(root.parent, stall=4 * BOUND).start()
    got: dict[int, tuple[bytes | int, float]] = {}

    def read(j: int) -> None:
        t = time.monotonic()
        got[j] = read_or_errno(mnt / f"a/c/0/{j}"), time.monotonic() - t

    try:
        options = (f"request_timeout={REQUEST_TIMEOUT}", f"retry_deadline={RETRY_DEADLINE}", "readahead=0")
        with zvfs_mount(f"{server.url}/{root.name}", tmp_path / "mnt", log=tmp_path / "zvfs.log", options=options) as mnt:
            server.set("stall")
            readers = [threading.Thread(target=read, args=(j,)) for j in range(16)]
            for r in readers:
                r.start()
            for r in readers:
                r.join(60)
            took = sorted(seconds for _, seconds in got.values())
            print(f"\n16 readers of one directory, store stalled: {' '.join(f'{s:.1f}' for s in took)} s (bound {BOUND} s)")
            assert {j: result for j, (result, _) in got.items()} == {j: errno.EIO for j in range(16)}
            assert took[-1] < BOUND + 1.5, f"a lookup ended after {took[-1]:.1f} s"
            server.set("ok")
            give_up = time.monotonic() + 5
            while any(read_or_errno(mnt / f"a/c/0/{j}") != chunk(data, j) for j in range(16)):
                assert time.monotonic() < give_up, "the store answers again but files still fail"
                time.sleep(0.2)
    finally:
        server.stop()


def timed_cat(path: Path, timeout: float) -> tuple[int, bytes, float]:
    """(exit status, output, seconds) of `cat path`; a cat still waiting after `timeout` fails
    the test (it is killed, but stays in D state while its lookup waits)."""
    t = time.monotonic()
    cat = subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        out, _ = cat.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        cat.kill()
        pytest.fail(f"cat {path} hangs (> {timeout:g} s)")
    return cat.returncode, out, time.monotonic() - t


@contextlib.contextmanager
def hung_shard(store, tmp_path: Path):
    """A copy of the store whose shard a/c/0/0 sits on a filesystem whose open never returns."""
    root = tmp_path / "store.zarr"
    shutil.copytree(store[0], root)
    shard = root / "a/c/0/0"
    hung = subprocess.Popen([sys.executable, str(Path(__file__).with_name("hung_file.py")), str(shard),
                             str(shard.stat().st_size)])
    try:
        give_up = time.monotonic() + 20
        while not os.path.ismount(shard):
            assert hung.poll() is None and time.monotonic() < give_up, "the hung filesystem did not mount"
            time.sleep(0.1)
        yield root
    finally:
        hung.kill()
        hung.wait()
        subprocess.run(["fusermount3", "-uz", str(shard)], capture_output=True)


def test_a_shard_on_a_hung_filesystem_costs_its_own_files_only(store, tmp_path):
    """One shard file of a local store sits on a filesystem whose open never returns. While a
    reader waits for a file of that shard, the files of the other shards of the same directory
    read right (the first within STALL_PATIENCE + 2 s, as the lookup ahead of it gives up),
    and the hung shard's files are EIO, the waiting reader's too."""
    data = store[1]
    with hung_shard(store, tmp_path) as root:
        with zvfs_mount(root, tmp_path / "mnt", log=tmp_path / "zvfs.log") as mnt:
            waiting = subprocess.Popen(["cat", str(mnt / "a/c/0/1")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)
            for j in (5, 9, 14):
                status, out, seconds = timed_cat(mnt / f"a/c/0/{j}", STALL_PATIENCE + 10)
                print(f"\na/c/0/{j} (healthy shard) while a reader waits on the hung one: {seconds:.1f} s")
                assert (status, out) == (0, chunk(data, j))
                assert seconds < STALL_PATIENCE + 2
            status, _, seconds = timed_cat(mnt / "a/c/0/2", STALL_PATIENCE + 10)
            assert status != 0 and seconds < STALL_PATIENCE + 2
            assert waiting.wait(STALL_PATIENCE + 2) != 0
            assert "a/c/0/0: no answer within" in (tmp_path / "zvfs.log").read_text()


def test_a_hung_shard_costs_the_other_fronts_its_own_files_only(store, tmp_path):
    """The same for `zvfs serve` and the fsspec front (both hung for good before: only the
    FUSE daemon bounded its waits): a file of the hung shard is a 5xx / OSError within
    STALL_PATIENCE + 2 s, files of the other shards read right. (The processes are killed,
    and waited for only once the hung filesystem is gone: a thread of theirs waits on it.)"""
    import http.client

    from servers import ZvfsServe

    data = store[1]
    script = ("import sys, time, fsspec\n"
              "fs = fsspec.filesystem('zvfs', fo=sys.argv[1])\n"
              "for path in ('a/c/0/1', 'a/c/0/5'):\n"
              "    t = time.monotonic()\n"
              "    try:\n"
              "        out = fs.cat_file(path).hex()\n"
              "    except OSError as e:\n"
              "        out = 'error'\n"
              "    print(path, out, round(time.monotonic() - t, 2), flush=True)\n")
    started: list[subprocess.Popen] = []
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: [p.wait() for p in started])
        root = stack.enter_context(hung_shard(store, tmp_path))
        server = ZvfsServe(root, "-o", "umask=022", "--no-access-log", log=tmp_path / "serve.log").start()
        started.append(server.proc)
        stack.callback(server.proc.kill)
        host, port = server.url.removeprefix("http://").split(":")
        for path, want in (("a/c/0/1", None), ("a/c/0/5", chunk(data, 5)), ("a/c/0/2", None)):
            t = time.monotonic()
            conn = http.client.HTTPConnection(host, int(port), timeout=STALL_PATIENCE + 10)
            conn.request("GET", f"/{path}")
            r = conn.getresponse()
            body, seconds = r.read(), time.monotonic() - t
            conn.close()
            assert (r.status, body) == (200, want) if want else r.status >= 500, (path, r.status)
            assert seconds < STALL_PATIENCE + 2, (path, seconds)
        reader = subprocess.Popen([sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE)
        started.append(reader)
        stack.callback(reader.kill)
        out = b""
        give_up = time.monotonic() + 2 * STALL_PATIENCE + 20
        poller = select.poll()
        poller.register(reader.stdout, select.POLLIN)
        # (read1, not readline: both lines can come in one read, and a line left in the
        # reader's buffer is not seen by poll; the process never ends while its thread waits)
        while out.count(b"\n") < 2 and poller.poll(max(0.0, give_up - time.monotonic()) * 1000):
            if not (more := reader.stdout.read1(4096)):  # type: ignore[union-attr]
                break
            out += more
        lines = [line.split() for line in out.decode().splitlines()]
        got = {words[0]: words[1:] for words in lines}
        assert "a/c/0/1" in got and got["a/c/0/1"][0] == "error" and float(got["a/c/0/1"][1]) < STALL_PATIENCE + 2, lines
        assert "a/c/0/5" in got and bytes.fromhex(got["a/c/0/5"][0]) == chunk(data, 5), lines


def test_sigterm_stops_serve_while_a_request_waits_on_a_hung_shard(store, tmp_path):
    """SIGTERM while a request waits on the hung shard: the request is answered (502 once the
    open has waited STALL_PATIENCE), the server stops listening, writes its last lines and
    exits within STALL_PATIENCE + 3 s, below its drain bound. Its thread in the open of the
    hung FUSE file keeps the kernel from reaping it (a zombie: no code of its runs; the kernel
    cannot end a FUSE request the daemon has taken) until the hung filesystem is gone: then
    status 0, nothing left behind."""
    import socket

    from servers import ZvfsServe

    from zvfs.fronts.serve import DRAIN

    server = None
    try:
        with hung_shard(store, tmp_path) as root:
            server = ZvfsServe(root, "-o", "umask=022", log=tmp_path / "serve.log").start()
            pid = server.proc.pid  # type: ignore[union-attr]
            with socket.create_connection(("127.0.0.1", server.port)) as waiting:
                waiting.sendall(b"GET /a/c/0/1 HTTP/1.1\r\nHost: x\r\n\r\n")
                time.sleep(0.5)
                t = time.monotonic()
                server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
                while server.proc.poll() is None and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text():
                    assert time.monotonic() < t + STALL_PATIENCE + 3, "zvfs serve still runs after SIGTERM"
                    time.sleep(0.1)
                print(f"\nzvfs serve ended {time.monotonic() - t:.1f} s after SIGTERM (drain bound {DRAIN:g} s)")
                waiting.settimeout(5)
                assert waiting.recv(1 << 16).startswith(b"HTTP/1.1 502")
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", server.port), timeout=2)
            text = (tmp_path / "serve.log").read_text()
            assert '"GET /a/c/0/1 1.1" 502' in text and "INFO zvfs: stopped" in text, text
        assert server.proc.wait(5) == 0  # type: ignore[union-attr]
    finally:
        if server and server.proc.poll() is None:  # type: ignore[union-attr]
            server.proc.kill()  # type: ignore[union-attr]
            server.proc.wait()  # type: ignore[union-attr]


@pytest.mark.parametrize("second", [False, True], ids=["one signal", "then SIGINT"])
def test_sigterm_unmounts_within_its_grace_while_reads_wait_on_a_stalled_server(store, tmp_path, second):
    """SIGTERM to the daemon while readers wait on a server that stopped answering (every
    ranged GET held 60 s, past the default deadlines): the reads being answered are given up
    after STOP_GRACE, the mount goes and the daemon exits 0 within STOP_GRACE + 3 s (with a
    SIGINT right after, at once: within 1.5 s); every waiting reader fails with ECONNABORTED or
    ENOTCONN, none gets bytes.
    Before, the daemon waited for the reads' own deadlines (request_timeout 20 s, retried
    until 30 s), every reader of the mount in D state meanwhile (an outside attacker: 38 s)."""
    root, data = store
    server = MisbehavingHTTP(root.parent, stall=60).start()
    mnt, log = tmp_path / "mnt", tmp_path / "zvfs.log"
    mnt.mkdir()
    proc = subprocess.Popen([*ZVFS, "mount", "--foreground", f"{server.url}/{root.name}", str(mnt), "-o", f"log={log},readahead=0"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    waiting: list[subprocess.Popen] = []
    try:
        give_up = time.monotonic() + 30
        while not os.path.ismount(mnt):
            assert proc.poll() is None and time.monotonic() < give_up, "not mounted"
            time.sleep(0.1)
        assert (mnt / "a/c/0/5").read_bytes() == chunk(data, 5)
        server.set("stall")
        read = ("import sys\ntry:\n    open(sys.argv[1], 'rb').read()\n    print('read')\n"
                "except OSError as e:\n    print(e.errno)\n")
        waiting = [subprocess.Popen([sys.executable, "-c", read, str(mnt / f"a/c/0/{j}")], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL) for j in (1, 2, 9, 14)]
        time.sleep(1)
        assert all(w.poll() is None for w in waiting), "the readers did not wait"
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        if second:
            time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
        status = proc.wait(timeout=60)
        took = time.monotonic() - t
        print(f"\ndaemon exited {took:.1f} s after SIGTERM, 4 reads waiting on a stalled server (grace {STOP_GRACE:g} s)")
        assert status == 0 and took < (1.5 if second else STOP_GRACE + 3), (status, took)
        assert not is_mounted(mnt)
        # (the kernel fails the requests the daemon had taken with ECONNABORTED, the others ENOTCONN)
        failed = {w.communicate(timeout=10)[0].strip() for w in waiting}
        assert failed <= {str(errno.ECONNABORTED).encode(), str(errno.ENOTCONN).encode()}, failed
        assert "given up" in log.read_text()
    finally:
        for w in waiting:
            w.kill()
        proc.kill()
        force_unmount(mnt)
        server.stop()
