"""`zvfs serve`: open the source, serve its view over HTTP (fronts/http.py) with hypercorn's
trio worker until SIGTERM or SIGINT, then drain: no new connections, requests in flight are
answered for up to `--drain` seconds (default `DRAIN`), then hypercorn's `graceful_timeout`
closes the connections still open (a warning says so), and the exit status is 0 either way
(the process was asked to stop and has stopped; a non-zero status would mark a systemd unit
failed). SIGHUP reopens a `log=FILE`. The URL is printed on stdout once the socket listens
(`--listen HOST:0` picks a free port).

Nothing a request waits on holds the stop beyond the drain: a read of a local file on a hung
mount gives up after `STALL_PATIENCE` (its thread abandoned), a remote store's after its
deadlines. The kernel may still hold the process after it has exited: a thread in an open of
a FUSE file whose daemon took the request and never answers cannot die until the daemon
answers or its connection is aborted (`fusermount3 -uz`, the daemon killed); the server has
stopped listening and its status is 0, reaped then (tests/test_stalls.py)."""

from __future__ import annotations

import logging
import os
import signal
import socket
from functools import partial

import trio
from hypercorn.config import Config
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from ..core.paths import Paths
from ..core.shown import Shown
from ..core.source import open_source
from ..errors import MetadataError, StorageError, ZvfsError
from ..logs import Logs
from ..options import MountOptions
from ..storage import leases
from ..storage.local import use_descriptor_limit
from .access_log import AccessLog
from .http import App
from .mounting import shown

log = logging.getLogger("zvfs")

DEFAULT_LISTEN = "127.0.0.1:8080"
#: the bodies being sent hold at most an eighth of the memory budget together (http.py `BLOCK`;
#: about twice that in the process: a body message is copied once on its way to the socket)
SENDING_SHARE = 8
#: seconds requests in flight get after SIGTERM: a slow reader of a large file finishes, and the
#: stop still ends within systemd's default TimeoutStopSec (90 s)
DRAIN = 30.0


def _config(listen: str, access_log: bool, logs: Logs, drain: float) -> Config:
    config = Config()
    config.logger_class = AccessLog.logger_class(logs)
    config.bind = [listen]
    config.accesslog = logging.getLogger("zvfs.access") if access_log else None
    config.errorlog = logging.getLogger("zvfs.server")
    config.graceful_timeout = drain
    config.backlog = 1024  # (64 clients connecting at once must not see refused connections)
    return config


def _shut_connections(ports: set[int]) -> int:
    """Shut down both ways the connections this process accepted (TCP sockets whose local port
    is one it listens on): how many. hypercorn 0.18 sends in a shielded scope (trio/tcp_server.py,
    `protocol_send`), so a client that stops reading holds its connection, and the stop, past
    `graceful_timeout` for good; a shut-down socket fails that send (EPIPE), which hypercorn
    takes as the client gone. (Outgoing connections to a store never have a listening port as
    their own.)"""
    shut = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=int(name))
        except OSError:  # (closed meanwhile, or not a socket after all)
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.getsockname()[1] in ports and sock.getpeername():
                sock.shutdown(socket.SHUT_RDWR)
                shut += 1
        except (OSError, IndexError, TypeError):  # (a listener: no peer; a Unix socket: no port)
            pass
        finally:
            sock.detach()
    return shut


async def _serve(source: str, opts: MountOptions, listen: str, cors: list[str], max_age: int, access_log: bool,
                 drain: float, logs: Logs) -> None:
    config = _config(listen, access_log, logs, drain)
    use_descriptor_limit()  # (each connection, and each request's shard, holds a descriptor)
    if not opts.no_leases:
        leases.enable()  # (a request reading a shard replaced by rename keeps its bytes: leases.py)
    try:
        opened = await open_source(source, opts)
    except StorageError as e:
        raise MetadataError(shown(source), str(e)) from None
    except (OSError, ValueError) as e:  # what backends raise for unusable URLs and hosts
        raise MetadataError(shown(source), f"cannot open: {e.strerror if isinstance(e, OSError) and e.strerror else e}") from None
    try:
        shown_as = Shown(opened.root, opts.uid, opts.gid, opts.umask)
        app = App(Paths(opened, shown_as, public=True), cors, max_age, sending=opts.memory // SENDING_SHARE)
        stop = trio.Event()
        try:  # (here, not in hypercorn's task: a refusal is one line, not an exception group)
            sockets = config.create_sockets()
            for sock in sockets.insecure_sockets:
                sock.listen(config.backlog)
        except (OSError, ValueError) as e:
            raise ZvfsError(f"cannot listen on {listen}: {getattr(e, 'strerror', None) or e}") from None
        ports = {sock.getsockname()[1] for sock in sockets.insecure_sockets}

        async def cut_after_drain() -> None:
            await trio.sleep(drain + 0.5)  # (hypercorn's own deadline first: it cancels all but sends)
            log.warning("shut down %d connections still sending %g s after the drain began (clients not reading)",
                        _shut_connections(ports), drain)

        async def on_signals(signals, server: trio.CancelScope) -> None:
            """SIGTERM or SIGINT: drain; a second one: stop at once (as a second Ctrl-C would)."""
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum == signal.SIGHUP:
                    logs.reopen()
                elif not stop.is_set():
                    log.info("received %s: draining requests in flight, then exiting (again: at once)", name)
                    app.draining = True
                    stop.set()
                    outer.start_soon(cut_after_drain)
                else:
                    log.warning("received %s again: shut down %d connections without draining", name,
                                _shut_connections(ports))
                    server.cancel()

        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as outer:  # (what outlives hypercorn's drain)
                outer.start_soon(config.log.flush_every_second)
                # anyone reads: a directory the store narrows stops being served within RECHECK s
                outer.start_soon(opened.watch_permissions, lambda: shown_as.follow(opened.root))
                async with trio.open_nursery() as nursery:
                    outer.start_soon(on_signals, signals, nursery.cancel_scope)
                    binds = await nursery.start(partial(worker_serve, wrap_app(app, config.wsgi_max_body_size, "asgi"),
                                                        config,
                                                        sockets=sockets, shutdown_trigger=stop.wait))
                    url = binds[0].rstrip("/") + "/"
                    log.info("serving %s (%s view) at %s", opened.store.display, opened.view, url)
                    print(f"zvfs: serving {opened.store.display} ({opened.view} view) at {url}", flush=True)
                    await stop.wait()
                    stopping = trio.current_time()
                outer.cancel_scope.cancel()  # (hypercorn has returned: the drain is over)
            config.log.flush()  # (the last requests' lines before the lines that say it stopped)
            if trio.current_time() - stopping >= drain:
                log.warning("requests still in flight after %g s (--drain): their connections were closed", drain)
            log.info("stopped")
    finally:
        config.log.flush()  # (whatever ended the server)
        with trio.CancelScope(shield=True):
            await opened.store.aclose()


def run(source: str, opts: MountOptions, listen: str = DEFAULT_LISTEN, cors: list[str] | None = None,
        max_age: int = 0, access_log: bool = True, drain: float = DRAIN) -> int:
    """Serve until signalled: 0 after a clean stop. A source that does not open or an address
    that cannot be listened on raises ZvfsError (the command says it, exit 2)."""
    logs = Logs(opts, background=False)
    try:
        trio.run(_serve, source, opts, listen, list(cors or []), max_age, access_log, drain, logs)
    except ZvfsError as e:
        if opts.log_file:  # (stderr gets it from the command)
            log.error("%s", e)
        raise
    return 0
