"""Read leases on local files (fcntl F_SETLEASE): the kernel's word that no byte of a file
changed while the lease held.

Why: an open file is a snapshot (docs/reliability.md), and a local shard replaced by rename
keeps its old inode for the handles that pinned it, with its old bytes; but its ctime changes
and its link count drops to 0 when the rename unlinks it, so a state check (size, times)
cannot tell "replaced, bytes unchanged" from "written in place, then replaced", and old handles
got EIO. A read lease tells them apart: the kernel breaks it whenever any process opens the
file for writing or truncates it, and a rename or unlink leaves it alone. While `holds` says
so, the bytes are those the file had when the lease was taken.

A broken lease makes the writer's open wait until the holder lets go (at most
/proc/sys/fs/lease-break-time, 45 s by default): the holder is told by a signal, whose handler
only asks the trio loop to let go of every lease being broken (`TrioToken.run_sync_soon`,
signal-safe, idempotent: one pass however many signals came meanwhile). Doing the work in
the handler itself ran it nested under a flood of signals: RecursionError, which ended the
daemon (an outside attacker's SIGURG flood while shards were replaced, 3 of 7 floods), and
leases left breaking until the kernel's 45 s. The signal is SIGURG, whose default action is
to ignore it (SIGIO's is to end the process: a lease outliving its handler would kill the
daemon). A lease let go of is taken again at the next open of the file with no writer
(`take` again: the descriptor's holder does it), so one open for writing does not cost a shard
its lease for good. Only a process that installs the handler takes
leases (`enable`, from the main thread: the FUSE daemon); stores inside other programs (the
fsspec front) never do. Leases fail where they cannot hold (a file open for writing now, a file
of another owner without CAP_LEASE, filesystems without leases): those files keep the state
check alone.
"""

from __future__ import annotations

import errno
import fcntl
import signal

import trio

SIGNAL = signal.SIGURG
F_SETSIG = getattr(fcntl, "F_SETSIG", 10)  # (Linux; not exported by Python's fcntl module)

_held: set[int] = set()  # descriptors holding a lease (their numbers: closed only after `forget`)
_enabled = False
_loop: trio.lowlevel.TrioToken | None = None


def enable() -> bool:
    """Take leases from now on in this process, from inside its trio loop's main thread (the
    handler installed); False where it cannot be."""
    global _enabled, _loop
    try:
        _loop = trio.lowlevel.current_trio_token()
        signal.signal(SIGNAL, _on_signal)
    except (RuntimeError, ValueError):  # no trio loop here; not the main thread
        return False
    _enabled = True
    return True


def take(fd: int) -> bool | None:
    """A read lease on `fd` (opened read-only), if this process takes leases and the kernel
    grants it: True; False if not now (the file is open for writing: worth asking again);
    None if never (not enabled, a file of another owner, a filesystem without leases)."""
    if not _enabled:
        return None
    _held.add(fd)  # (first: a break right after the lease is taken must find it)
    try:
        fcntl.fcntl(fd, F_SETSIG, SIGNAL)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as e:
        _held.discard(fd)
        return False if e.errno == errno.EAGAIN else None
    return True


def holding(fd: int) -> bool:
    """`fd` was granted a lease not let go of since (cheap: no system call)."""
    return fd in _held


def holds(fd: int) -> bool:
    """No process has opened the file of `fd` for writing, or truncated it, since `take` (a
    lease being broken counts as gone: the writer may go on any moment)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK
    except OSError:
        return False


def forget(fd: int) -> None:
    """Before `fd` is closed (its number may then name another file)."""
    _held.discard(fd)


def _on_signal(signum, frame) -> None:
    """A lease is being broken (the signal does not say which): the loop lets go."""
    try:
        _loop.run_sync_soon(_let_go, idempotent=True)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - the loop is gone (the process is ending): nothing holds on
        pass


def _let_go() -> None:
    """Let go of every lease whose break is under way, so that its writer goes on (on the loop;
    it must not raise)."""
    for fd in list(_held):
        try:
            if fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK:
                _held.discard(fd)
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        except OSError:
            _held.discard(fd)
