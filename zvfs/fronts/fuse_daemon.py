"""The daemon: open the source, mount, serve, and unmount cleanly on SIGTERM/SIGINT
(`zvfs mount --foreground`, which the front end in mounting.py starts). It tells its starter
through the pipe it was given (READY_FD_ENV) that the mount is live or why it is not; under
systemd (`Type=notify`) it also sends READY=1.

Signals are caught from the start of the event loop, so SIGTERM or SIGINT while the source is
still opening or the kernel is mounting ends with nothing mounted; SIGHUP only reopens the log
(logrotate). Once serving, SIGTERM or SIGINT stops reading requests and gives those being
answered STOP_GRACE seconds; the ones still waiting then (a read of a stalled server or a hung
filesystem) are given up and the daemon unmounts: the kernel fails them with ECONNABORTED, and
the requests it still held with ENOTCONN. (Before, the daemon waited for them: an outside attacker's SIGTERM
with a read waiting on a server that did not answer ended 38 s later, every other reader of
the mount in D state meanwhile.) A second signal gives them up at once.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import signal
import socket

import pyfuse3
import trio

from ..core.shown import Shown
from ..core.source import open_source
from ..errors import MetadataError, ZvfsError
from ..logs import Logs
from ..options import MountOptions
from ..storage import leases
from ..storage.local import use_descriptor_limit
from ..storage.urls import redact
from . import fuse_loop
from .fuse import ZvfsOperations, kernel_table, open_handles
from .mounting import READY_FD_ENV, check_mountpoint, shown

log = logging.getLogger("zvfs")

FUSECTL = "/sys/fs/fuse/connections"
#: seconds the requests being answered get after SIGTERM/SIGINT (module docstring): a read of
#: a cached or local chunk takes milliseconds, and every other reader of the mount waits
#: meanwhile (no request is read once the stop began)
STOP_GRACE = 2.0


# --------------------------------------------------------------------------- serving


def _fuse_options(source: str, opts: MountOptions) -> set[str]:
    name = (opts.fsname or redact(source)).replace(",", "_")
    fuse = set(pyfuse3.default_options) | {"ro", "noatime", f"fsname={name}", "subtype=zvfs"}
    if opts.allow_other:
        fuse |= {"allow_other", "default_permissions"}
    elif opts.allow_root:
        fuse |= {"allow_root", "default_permissions"}
    return fuse


def _sd_notify(message: str) -> None:
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(path)
        s.sendall(message.encode())


class _Ready:
    """Tells whoever started us that the mount is live, or why it is not."""

    def __init__(self) -> None:
        fd = os.environ.pop(READY_FD_ENV, None)
        self.fd = int(fd) if fd else None

    @property
    def background(self) -> bool:
        return self.fd is not None

    def send(self, error: str | None) -> None:
        if self.fd is not None:
            os.write(self.fd, (f"error: {error}\n" if error else "ok\n").encode())
            os.close(self.fd)
            self.fd = None
        if not error:
            _sd_notify("READY=1")


class _Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name} before the mount was live; nothing mounted")
        self.signum = signum


async def _serve(source: str, mountpoint: str, opts: MountOptions, ready: _Ready, logs: Logs) -> None:
    state = {"serving": False, "signal": None}
    answering = trio.CancelScope()  # pyfuse3's loop and the requests it is answering
    use_descriptor_limit()
    if not opts.no_leases:
        leases.enable()  # (old handles of a shard replaced by rename keep their bytes: leases.py)

    async def on_signals(signals, scope: trio.CancelScope) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:
                logs.reopen()
                continue
            if state["signal"] is not None:  # a second stop: the requests still answered are given up
                answering.cancel()
                continue
            log.info("received %s, unmounting", signal.Signals(signum).name)
            state["signal"] = signum
            if not state["serving"]:
                scope.cancel()  # still opening or mounting
                return
            pyfuse3.terminate()  # no more requests read: main() returns once those answered end,
            answering.deadline = trio.current_time() + STOP_GRACE  # or these are given up; the finally below unmounts

    async def mount_and_serve(nursery: trio.Nursery) -> None:
        try:
            opened = await open_source(source, opts)
        except (OSError, ValueError) as e:  # what backends raise for unusable URLs and hosts
            raise MetadataError(shown(source), f"cannot open: {e.strerror if isinstance(e, OSError) and e.strerror else e}") from None
        mounted = False
        try:
            shown_as = Shown(opened.root, opts.uid, opts.gid, opts.umask)

            async def refresh() -> None:  # `zvfs refresh`
                await opened.refresh()
                shown_as.follow(opened.root)

            def permissions_changed() -> None:  # (the source read them again)
                shown_as.follow(opened.root)
                ops.forget_kernel_view()

            ops = ZvfsOperations(opened.tree, shown_as, opened.stats, refresh,
                                 push_ahead=opts.readahead if opened.local else 0,
                                 kernel_kept=kernel_table(opts), kernel_checks=opts.allow_other or opts.allow_root,
                                 max_handles=open_handles(opts))
            pyfuse3.init(ops, mountpoint, _fuse_options(source, opts))
            mounted = True
            log.info("mounted %s on %s (%s view)", opened.store.display, mountpoint, opened.view)
            await trio.lowlevel.checkpoint()  # a signal that came during the mount is seen here
            ready.send(None)
            if logs.background:
                logs.detach()
            nursery.start_soon(_tune_connection, mountpoint, opts.max_background)
            if ops.kernel_checks:  # other users read: directories narrowed in the store close to them
                nursery.start_soon(opened.watch_permissions, permissions_changed)
            state["serving"] = True
            fuse_loop.install()
            with answering:
                await pyfuse3.main()
            if answering.cancelled_caught:
                log.warning("requests still waiting %g s after the stop were given up (ECONNABORTED)", STOP_GRACE)
        finally:
            with trio.CancelScope(shield=True):
                if mounted:
                    _sd_notify("STOPPING=1")
                    pyfuse3.close(unmount=True)
                    log.info("unmounted %s", mountpoint)
                await opened.store.aclose()

    failure = None
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(on_signals, signals, nursery.cancel_scope)
            try:
                await mount_and_serve(nursery)
            except (ZvfsError, RuntimeError) as e:  # raised here, not as an exception group
                failure = e
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    if state["signal"] is not None and not state["serving"]:
        raise _Interrupted(state["signal"])


async def _tune_connection(mountpoint: str, max_background: int) -> None:
    """Let the kernel keep more requests in flight than its default 12, so that parallel
    readers of a remote store get parallel backend requests (measured: 16 readers at 10 ms
    latency, 6.6x -> 9.6x faster than one reader with 64). Needs root; skipped otherwise."""
    try:
        # stat() of the mount point is answered by this daemon: do it off the event loop
        dev = (await trio.to_thread.run_sync(os.stat, mountpoint)).st_dev
        if not os.path.ismount(FUSECTL) and os.geteuid() == 0:  # systemd usually mounts it
            await trio.run_process(["mount", "-t", "fusectl", "fusectl", FUSECTL], check=False, capture_stderr=True)
        conn = f"{FUSECTL}/{os.minor(dev)}"
        for name, value in (("max_background", max_background), ("congestion_threshold", max_background * 3 // 4)):
            with open(f"{conn}/{name}", "w") as f:
                f.write(str(value))
        # larger kernel read-ahead for big chunk files read through the page cache
        with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb", "w") as f:
            f.write("1024")
        log.debug("%s: max_background %d, read_ahead_kb 1024", conn, max_background)
    except OSError as e:
        log.debug("cannot tune the FUSE connection: %s", e)


def run_foreground(source: str, mountpoint: str, opts: MountOptions) -> int:
    """Serve until unmounted or signalled. Returns the exit status: 0 after a clean unmount,
    2 for a source or mount point that cannot be used, 1 when the kernel refused the mount,
    128+N when signal N came before the mount was live."""
    ready = _Ready()
    logs = Logs(opts, ready.background)
    os.chdir("/")  # never keep a directory (or the file system under it) busy
    try:
        check_mountpoint(mountpoint)
        trio.run(_serve, source, mountpoint, opts, ready, logs)
    except _Interrupted as e:
        log.info("%s", e)
        ready.send(str(e))
        return 128 + e.signum
    except ZvfsError as e:
        log.error("%s", e)
        ready.send(str(e))
        return 2
    except RuntimeError as e:  # pyfuse3.init failures; libfuse said why on stderr
        msg = f"{mountpoint}: cannot mount ({e})"
        log.error("%s", msg)
        ready.send(msg)
        return 1
    return 0


