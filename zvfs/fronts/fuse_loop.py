"""pyfuse3's request loop without a trio round per request while requests are waiting.

pyfuse3 reads each request after `await trio.lowlevel.wait_readable(fd)`, which always parks
the task and lets trio's run loop register the descriptor with epoll (EPOLLONESHOT: one
`epoll_ctl` per request) and wait for it (`epoll_wait`) before the task runs again, even when
the kernel already has requests queued, as it does whenever several readers are busy. pyfuse3
takes its `trio` from a module attribute (`pyfuse3.trio`, which `pyfuse3.asyncio` replaces the
same way): `install` gives it a `trio` whose `lowlevel.wait_readable` first asks the
descriptor with a zero-timeout `poll` and, when a request is there, returns at once, for at
most `RUN` requests running; then (or when nothing is there) it waits the usual way, which
lets every other task run (parked pushes, worker-thread results, the permission watch). A
request is read only when `poll` says one is there: the descriptor is blocking, and a read
with none would stop the loop. The one `trio.Lock` pyfuse3 makes, the read lock its request
tasks take before each wait, is replaced the same way (`_ReadLock`): trio's lock yields at
every acquire and hands itself to the waiting task at every release, so pyfuse3's two request
tasks took turns, a trio round (an `epoll_wait` and the scheduler's pass) per request.

Measured (`find | xargs -P 4 cat` of 4,096 files on a fresh mount, medians of 5 alternated
runs, daemon CPU from /proc): 4 KiB files 766 -> 649 ms a walk (the pyfuse3 floor: 645), 64 KiB
1,097 -> 1,044 ms (floor 977); daemon CPU 690 -> 550 ms and 1,010 -> 890 ms. The read lock
(`_ReadLock`), on top: `epoll_wait` calls in a 64 KiB walk with 4 readers 8,833 -> 563 (perf's
syscall tracepoints on the daemon), zvfs/floor 1.06 -> 0.92 and 1.10 -> 0.83 (`scripts/bench
--only local --runs 7 --also` the code before, twice; 4 KiB 0.94 -> 0.69, 0.80 -> 0.56).
"""

from __future__ import annotations

import select
import types

import pyfuse3
import trio

#: requests read back to back without a trio round, before one. In a walk of the 4 KiB array
#: 86-88% of the polls found a request waiting, with one reader as with four (OPEN and RELEASE
#: come from different processes); with 8, one request in 8 still took the round
RUN = 64
#: requests read in the current run, shared by the wait and the read lock (RUN or more: the
#: next wait takes a trio round)
_run = [0]


class _Lowlevel(types.SimpleNamespace):
    """trio.lowlevel, but for `wait_readable`."""

    def __getattr__(self, name: str):
        return getattr(trio.lowlevel, name)


class _Trio(types.SimpleNamespace):
    """The `trio` pyfuse3 sees: trio itself, but for `lowlevel`."""

    def __getattr__(self, name: str):
        return getattr(trio, name)


async def _ready() -> None:
    """An await that returns at once (no trio round)."""


class _ReadLock:
    """pyfuse3's read lock, which each of its request tasks takes to wait for and read a request.
    A trio.Lock hands itself to the task waiting for it at release, so that with two tasks
    (pyfuse3 keeps one waiting while another answers) every request is read by the other task
    than the last: a trio round per request, even when the answering task never awaits. Here
    the task that releases may take it back at once while the run lasts (the lock is free);
    the waiting task is woken at each release and takes it if it is still free when it runs,
    which it is when the answering task awaited (its handler waits for I/O): as before, a
    request is read while another is being answered."""

    def __init__(self) -> None:
        self._held = False
        self._waiting = trio.lowlevel.ParkingLot()

    async def __aenter__(self) -> None:
        if not self._held:
            self._held = True
            if _run[0] >= RUN:  # (the run is over: a round, as trio's lock)
                await trio.lowlevel.cancel_shielded_checkpoint()
            return
        while self._held:
            await self._waiting.park()
        self._held = True

    async def __aexit__(self, *exc) -> None:
        self._held = False
        self._waiting.unpark()


def round_next() -> None:
    """The next wait for a request takes a trio round first, so that work just handed to
    another task (the push of a walk's next files once an open answered: `fuse._Parked`) runs
    before the next request is read, as when every request took a round (without it, a lone
    reader's walk under load found 1 file in 128 not yet pushed: a CI run)."""
    _run[0] = RUN


def install() -> None:
    """pyfuse3's loop reads waiting requests without a trio round each (module docstring)."""
    poller, polled, run = select.poll(), [None], _run
    run[0] = 0  # (a new session)

    def wait_readable(fd):
        if polled[0] != fd:
            if polled[0] is not None:
                poller.unregister(polled[0])
            poller.register(fd, select.POLLIN)
            polled[0] = fd
        if run[0] < RUN:
            try:
                ready = poller.poll(0)
            except OSError:
                ready = ()
            if ready and ready[0][1] & select.POLLIN and not ready[0][1] & (select.POLLNVAL | select.POLLERR):
                run[0] += 1
                return _ready()
        run[0] = 0
        return trio.lowlevel.wait_readable(fd)

    pyfuse3.trio = _Trio(lowlevel=_Lowlevel(wait_readable=wait_readable), Lock=_ReadLock)  # type: ignore[attr-defined]
