"""`zvfs serve`: open the source, serve its view over HTTP (fronts/http.py) with hypercorn's
trio worker until SIGTERM or SIGINT, then drain: no new connections, requests in flight are
answered (for up to `DRAIN` seconds), and the exit status is 0. SIGHUP reopens a `log=FILE`.
The URL is printed on stdout once the socket listens (`--listen HOST:0` picks a free port)."""

from __future__ import annotations

import logging
import signal
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
from .access_log import AccessLog
from .http import App
from .mounting import shown

log = logging.getLogger("zvfs")

DEFAULT_LISTEN = "127.0.0.1:8080"
DRAIN = 30.0  # seconds requests in flight get after SIGTERM


def _config(listen: str, access_log: bool, logs: Logs) -> Config:
    config = Config()
    config.logger_class = AccessLog.logger_class(logs)
    config.bind = [listen]
    config.accesslog = logging.getLogger("zvfs.access") if access_log else None
    config.errorlog = logging.getLogger("zvfs.server")
    config.graceful_timeout = DRAIN
    config.backlog = 1024  # (64 clients connecting at once must not see refused connections)
    return config


async def _serve(source: str, opts: MountOptions, listen: str, cors: list[str], max_age: int, access_log: bool,
                 logs: Logs) -> None:
    config = _config(listen, access_log, logs)
    try:
        opened = await open_source(source, opts)
    except StorageError as e:
        raise MetadataError(shown(source), str(e)) from None
    except (OSError, ValueError) as e:  # what backends raise for unusable URLs and hosts
        raise MetadataError(shown(source), f"cannot open: {e.strerror if isinstance(e, OSError) and e.strerror else e}") from None
    try:
        app = App(Paths(opened, Shown(opened.root, opts.uid, opts.gid, opts.umask), public=True), cors, max_age)
        stop = trio.Event()
        try:  # (here, not in hypercorn's task: a refusal is one line, not an exception group)
            sockets = config.create_sockets()
            for sock in sockets.insecure_sockets:
                sock.listen(config.backlog)
        except (OSError, ValueError) as e:
            raise ZvfsError(f"cannot listen on {listen}: {getattr(e, 'strerror', None) or e}") from None

        async def on_signals(signals) -> None:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    logs.reopen()
                    continue
                log.info("received %s: draining requests in flight, then exiting", signal.Signals(signum).name)
                app.draining = True
                stop.set()
                return

        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as flushing:
                flushing.start_soon(config.log.flush_every_second)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(on_signals, signals)
                    binds = await nursery.start(partial(worker_serve, wrap_app(app, config.wsgi_max_body_size, "asgi"),
                                                        config,
                                                        sockets=sockets, shutdown_trigger=stop.wait))
                    url = binds[0].rstrip("/") + "/"
                    log.info("serving %s (%s view) at %s", opened.store.display, opened.view, url)
                    print(f"zvfs: serving {opened.store.display} ({opened.view} view) at {url}", flush=True)
                    await stop.wait()
                flushing.cancel_scope.cancel()  # (hypercorn has returned: the drain is over)
            log.info("stopped")
    finally:
        config.log.flush()  # (every line, whatever ended the server)
        with trio.CancelScope(shield=True):
            await opened.store.aclose()


def run(source: str, opts: MountOptions, listen: str = DEFAULT_LISTEN, cors: list[str] | None = None,
        max_age: int = 0, access_log: bool = True) -> int:
    """Serve until signalled: 0 after a clean stop. A source that does not open or an address
    that cannot be listened on raises ZvfsError (the command says it, exit 2)."""
    logs = Logs(opts, background=False)
    try:
        trio.run(_serve, source, opts, listen, list(cors or []), max_age, access_log, logs)
    except ZvfsError as e:
        if opts.log_file:  # (stderr gets it from the command)
            log.error("%s", e)
        raise
    return 0
