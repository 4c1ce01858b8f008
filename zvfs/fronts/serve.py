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
stopped listening and its status is 0, reaped then (tests/test_stalls.py).

`--workers N` (N > 1) serves from N processes, as gunicorn, uvicorn and hypercorn's own
`--workers` do: one request is answered by one Python thread, and hypercorn's trio worker tops
out near one core's worth of requests (docs/benchmarks.md, "The server's floor"). The parent
listens, forks the workers (each opens the source itself: its own caches, its own `-o memory`
budget, its own `/.zvfs/stats` and `/.zvfs/metrics`, labelled with its number), prints the URL
once every worker serves, and otherwise only waits: a worker that dies is started again; a
source that does not open is one line and exit 2, as with one process. A stop reaches each
worker once however it is sent: a supervisor signals the whole group (systemd's SIGTERM to
every process of the unit, a terminal's Ctrl-C to the foreground group), a user may signal
the parent alone, so the parent passes a stop on as SIGUSR1 ("drain", which a worker already
draining ignores) and a second as SIGUSR2 ("at once"); a worker whose parent dies drains."""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import sys
import time
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
from .http import App, shut_connections
from .mounting import check_log_target, shown

log = logging.getLogger("zvfs")

DEFAULT_LISTEN = "127.0.0.1:8080"
#: the bodies being sent hold at most an eighth of the memory budget together (http.py `BLOCK`;
#: about twice that in the process: a body message is copied once on its way to the socket)
SENDING_SHARE = 8
#: seconds requests in flight get after SIGTERM: a slow reader of a large file finishes, and the
#: stop still ends within systemd's default TimeoutStopSec (90 s)
DRAIN = 30.0
#: the signals a server acts on: SIGTERM and SIGINT drain (a second one: stop at once); from a
#: `--workers` parent, SIGUSR1 drains and SIGUSR2 stops at once; SIGHUP reopens the log file
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
#: a worker that died this soon after it was started is started again only after this pause
#: (a worker that cannot stay up must not be forked in a loop)
RESTART_PAUSE = 1.0
#: seconds workers still starting get to stop when the start is given up (a source that did not
#: open in one of them, or a stop): then they are killed (a hung store must not hang the exit)
START_STOP = 10.0


def _config(listen: str, access_log: bool, logs: Logs, drain: float) -> Config:
    config = Config()
    config.logger_class = AccessLog.logger_class(logs)
    config.bind = [listen]
    config.accesslog = logging.getLogger("zvfs.access") if access_log else None
    config.errorlog = logging.getLogger("zvfs.server")
    config.graceful_timeout = drain
    config.backlog = 1024  # (64 clients connecting at once must not see refused connections)
    return config


def _listening(config: Config, listen: str):
    """hypercorn's sockets for `config.bind`, listening; one line if they cannot be."""
    try:
        sockets = config.create_sockets()
        for sock in sockets.insecure_sockets:
            sock.listen(config.backlog)
    except (OSError, ValueError) as e:
        raise ZvfsError(f"cannot listen on {listen}: {getattr(e, 'strerror', None) or e}") from None
    return sockets


class _Worker:
    """A `--workers` process: its number, and the pipe on which it tells the parent it serves
    (`R` and the line to print) or why it cannot (`E` and the one-line error)."""

    def __init__(self, index: int, pipe: int):
        self.index, self.pipe = index, pipe
        #: signals received outside trio's receiver (while the source opens, and after the
        #: stop): kept by a handler of its own, acted on once the server is up; none may kill
        #: a worker that is draining (the same stop comes from the parent and the supervisor)
        self.early: list[int] = []

    def keep(self, signum, frame) -> None:
        self.early.append(signum)

    def tell(self, kind: str, text: str) -> None:
        message = (kind + text.replace("\n", " "))[:select.PIPE_BUF - 1] + "\n"  # (one write: never interleaved)
        os.write(self.pipe, message.encode(errors="replace"))


async def _serve(source: str, opts: MountOptions, listen: str, cors: list[str], max_age: int, access_log: bool,
                 drain: float, logs: Logs, sockets=None, worker: _Worker | None = None) -> None:
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
        app = App(Paths(opened, shown_as, public=True), cors, max_age, sending=opts.memory // SENDING_SHARE,
                  worker=0 if worker is None else worker.index)
        stop = trio.Event()
        if sockets is None:  # (here, not in hypercorn's task: a refusal is one line, not an exception group)
            sockets = _listening(config, listen)
        ports = {sock.getsockname()[1] for sock in sockets.insecure_sockets}

        async def cut_after_drain() -> None:
            await trio.sleep(drain + 0.5)  # (hypercorn's own deadline first: it cancels all but sends)
            log.warning("shut down %d connections still sending %g s after the drain began (clients not reading)",
                        shut_connections(ports), drain)

        async def on_signals(signals, server: trio.CancelScope) -> None:
            """SIGTERM or SIGINT: drain; a second one: stop at once (as a second Ctrl-C would).
            From a `--workers` parent, SIGUSR1: drain (nothing more when draining: the same
            stop may also come straight from the supervisor), SIGUSR2: at once."""
            direct = 0

            def act(signum: int) -> None:
                nonlocal direct
                name = signal.Signals(signum).name
                if signum == signal.SIGHUP:
                    logs.reopen()
                    return
                direct += signum in (signal.SIGTERM, signal.SIGINT)
                if signum == signal.SIGUSR2 or direct > 1:
                    log.warning("received %s %s: shut down %d connections without draining", name,
                                "(stop at once)" if signum == signal.SIGUSR2 else "again", shut_connections(ports))
                    server.cancel()
                elif not stop.is_set():
                    log.info("received %s: draining requests in flight, then exiting (again: at once)", name)
                    app.draining = True
                    stop.set()
                    outer.start_soon(cut_after_drain)

            for signum in worker.early if worker is not None else ():
                act(signum)
            async for signum in signals:
                act(signum)

        with trio.open_signal_receiver(*SIGNALS) as signals:
            async with trio.open_nursery() as outer:  # (what outlives hypercorn's drain)
                outer.start_soon(config.log.flush_every_second)
                outer.start_soon(app.watch_listings)
                # anyone reads: a directory the store narrows stops being served within RECHECK s
                outer.start_soon(opened.watch_permissions, lambda: shown_as.follow(opened.root))
                async with trio.open_nursery() as nursery:
                    outer.start_soon(on_signals, signals, nursery.cancel_scope)
                    binds = await nursery.start(partial(worker_serve, wrap_app(app, config.wsgi_max_body_size, "asgi"),
                                                        config,
                                                        sockets=sockets, shutdown_trigger=stop.wait))
                    url = binds[0].rstrip("/") + "/"
                    line = f"zvfs: serving {opened.store.display} ({opened.view} view) at {url}"
                    if worker is None:
                        log.info("serving %s (%s view) at %s", opened.store.display, opened.view, url)
                        print(line, flush=True)
                    else:
                        log.info("worker %d serving", worker.index)
                        worker.tell("R", line)
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


def _worker_main(worker: _Worker, args: tuple, sockets, parent: int) -> int:
    """A forked worker of process `parent`: serve until told to stop; the exit status."""
    for signum in SIGNALS:  # (not the parent's handlers, which forward; trio's own while serving)
        signal.signal(signum, worker.keep)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    try:  # a worker whose parent dies (killed) drains and exits, never serves on orphaned
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGUSR1))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # (the parent died before the prctl)
        return 1
    try:
        trio.run(_serve, *args, sockets, worker)
    except ZvfsError as e:
        worker.tell("E", str(e))
        return 2
    return 0


class _Workers:
    """The parent of `--workers`: forks them, waits, starts one again when it dies, passes
    stops on (module docstring)."""

    def __init__(self, count: int, args: tuple, sockets):
        self.count, self.args, self.sockets = count, args, sockets
        self.read, self.write = os.pipe()
        os.set_blocking(self.read, False)
        self.pids: dict[int, tuple[int, float]] = {}  # pid -> (worker number, when started)
        self.stops = 0
        self.failed = 0

    def start(self, index: int) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)  # (no forwarding handler runs in the child)
        parent = os.getpid()
        try:
            pid = os.fork()
            if pid == 0:
                os.close(self.read)
                status = 1
                try:
                    status = _worker_main(_Worker(index, self.write), self.args, self.sockets, parent)
                finally:
                    logging.shutdown()
                    os._exit(status)
            self.pids[pid] = (index, time.monotonic())
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)

    def signal_all(self, signum: int) -> None:
        for pid in list(self.pids):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def on_signal(self, signum, frame) -> None:
        """(A Python signal handler: no logging here.) A stop closes the parent's listening
        sockets: once the draining workers have closed theirs, a new connection is refused at
        once, as with one process (the parent's copy kept the socket listening, and a new
        client waited, unanswered, for the whole drain: an outside attacker)."""
        if signum == signal.SIGHUP:
            self.signal_all(signal.SIGHUP)
            return
        if not self.stops:
            for sock in self.sockets.insecure_sockets:
                sock.close()
        self.stops += 1
        self.signal_all(signal.SIGUSR1 if self.stops == 1 else signal.SIGUSR2)

    def messages(self) -> list[str]:
        data = b""
        while True:
            try:
                part = os.read(self.read, 1 << 16)
            except BlockingIOError:
                break
            if not part:
                break
            data += part
        return data.decode(errors="replace").splitlines()

    def reap(self, block: bool) -> tuple[int, int, float] | None:
        """A worker that exited: (number, exit status, seconds it ran), or None."""
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == 0 or pid not in self.pids:
            return None
        index, started = self.pids.pop(pid)
        return index, os.waitstatus_to_exitcode(status), time.monotonic() - started

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self.on_signal)
        for index in range(self.count):
            self.start(index)
        ready, line, error = 0, "", ""
        while ready < self.count and not error and not self.stops:
            select.select([self.read], [], [], 0.2)
            gone = self.reap(block=False)  # (before the messages: a worker tells why, then exits)
            for message in self.messages():
                if message.startswith("R"):
                    ready, line = ready + 1, message[1:]
                elif message.startswith("E"):
                    error = error or message[1:]
            if gone is not None and not error:
                error = f"worker {gone[0]} exited with status {gone[1]} before it served"
        if error or self.stops:
            self.stops = max(self.stops, 1)
            self.signal_all(signal.SIGUSR2)  # (a worker still opening the source stops once it has)
            give_up = time.monotonic() + START_STOP
            while self.pids:
                if self.reap(block=False) is None:
                    if time.monotonic() > give_up:
                        self.signal_all(signal.SIGKILL)
                    time.sleep(0.05)
            if error:
                raise ZvfsError(error)
            return 0
        print(line, flush=True)
        log.info("%d workers serving", self.count)
        while self.pids:
            gone = self.reap(block=True)
            if gone is None:
                continue
            index, status, ran = gone
            for message in self.messages():  # (a restarted worker's "serving", or why it could not)
                if message.startswith("E"):
                    log.error("worker %d: %s", index, message[1:])
            if self.stops:  # (a worker killed meanwhile, by a signal, has stopped too)
                if status != 0:
                    log.warning("worker %d exited with status %d while stopping", index, status)
                self.failed += status > 0
                continue
            log.warning("worker %d exited with status %d: starting another", index, status)
            if ran < RESTART_PAUSE:
                time.sleep(RESTART_PAUSE)
            if not self.stops:  # (a stop meanwhile closed the sockets: none to start it on)
                self.start(index)
        log.info("stopped (%d workers)", self.count)
        return 1 if self.failed else 0


def run(source: str, opts: MountOptions, listen: str = DEFAULT_LISTEN, cors: list[str] | None = None,
        max_age: int = 0, access_log: bool = True, drain: float = DRAIN, workers: int = 1) -> int:
    """Serve until signalled: 0 after a clean stop. A source that does not open or an address
    that cannot be listened on raises ZvfsError (the command says it, exit 2). `workers` > 1:
    that many processes (module docstring)."""
    check_log_target(opts)  # (one line naming the option, as `zvfs mount` says it)
    logs = Logs(opts, background=False)
    args = (source, opts, listen, list(cors or []), max_age, access_log, drain, logs)
    try:
        if workers > 1:
            return _Workers(workers, args, _listening(_config(listen, access_log, logs, drain), listen)).run()
        trio.run(_serve, *args)
    except ZvfsError as e:
        if opts.log_file:  # (stderr gets it from the command)
            log.error("%s", e)
        raise
    return 0
