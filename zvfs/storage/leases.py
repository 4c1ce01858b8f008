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
/proc/sys/fs/lease-break-time, 45 s by default): the holder is told by a signal, and the handler
lets go at once of every lease being broken (measured: a writer's open waits ~1 ms). The
signal is SIGURG, whose default action is to ignore it (SIGIO's is to end the process: a lease
outliving its handler would kill the daemon). Only a process that installs the handler takes
leases (`enable`, from the main thread: the FUSE daemon); stores inside other programs (the
fsspec front) never do. Leases fail where they cannot hold (a file open for writing now, a file
of another owner without CAP_LEASE, filesystems without leases): those files keep the state
check alone.
"""

from __future__ import annotations

import fcntl
import signal

SIGNAL = signal.SIGURG
F_SETSIG = getattr(fcntl, "F_SETSIG", 10)  # (Linux; not exported by Python's fcntl module)

_held: set[int] = set()  # descriptors holding a lease (their numbers: closed only after `forget`)
_enabled = False


def enable() -> bool:
    """Take leases from now on in this process (the handler installed); False if it cannot be
    (not the main thread)."""
    global _enabled
    try:
        signal.signal(SIGNAL, _let_go)
    except ValueError:
        return False
    _enabled = True
    return True


def take(fd: int) -> bool:
    """A read lease on `fd` (opened read-only), if this process takes leases and the kernel
    grants it."""
    if not _enabled:
        return False
    _held.add(fd)  # (first: a break right after the lease is taken must find it)
    try:
        fcntl.fcntl(fd, F_SETSIG, SIGNAL)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:  # EAGAIN: open for writing now; EACCES: not ours; EINVAL: no leases here
        _held.discard(fd)
        return False
    return True


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


def _let_go(signum, frame) -> None:
    """A lease is being broken (the signal does not say which): let go of every lease whose
    break is under way, so that its writer goes on."""
    for fd in list(_held):
        try:
            if fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK:
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
                _held.discard(fd)
        except OSError:
            _held.discard(fd)

