"""The mount front end: the mount table, starting a daemon and waiting for it, unmounting.

`zvfs mount` without `--foreground` starts the daemon (daemon.py: this same program with
`--foreground`) as a child in its own session and waits on a pipe until the child says the
mount is live (or why it is not): the parent's exit status means "mounted", which is what
mount(8), fstab and scripts need. A child process (rather than fork) keeps threads and async
clients out of the picture. Until the mount is live the child's stderr goes to a file the
parent reads, so libfuse's and fusermount3's own words about a failed mount reach the terminal.

Apart from the daemon so that `zvfs mount`, `zvfs umount` and mount(8)'s helper load neither
pyfuse3 and trio nor the formats: their imports take 45 ms instead of 480 (a mount, `ls` and
unmount of the sample store: 1.13 -> 0.42 s).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import select
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass

from ..errors import MetadataError, OptionError
from ..options import MountOptions
from ..storage.urls import redact

log = logging.getLogger("zvfs")

READY_FD_ENV = "ZVFS_READY_FD"
ARGV_ENV = "ZVFS_ARGV"  # the real arguments of a process whose argv was redacted (see cli)
FSTYPE = "fuse.zvfs"  # what /proc/self/mountinfo says for our mounts (subtype=zvfs)


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s,]+")


def shown(text: str) -> str:
    """`text` with every URL in it as it may be shown (no user:password, no query string):
    for process titles, messages and logs."""

    def one(m: re.Match) -> str:
        try:
            return redact(m.group())
        except ValueError:  # unparseable: show the scheme only
            return m.group().split("://", 1)[0] + "://..."

    return _URL.sub(one, text)


# --------------------------------------------------------------------------- the mount table


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str
    device: str = ""  # the file system's major:minor
    root: str = "/"  # the directory of that file system mounted here (a bind mount's: below its root)


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts() -> list[Mount]:
    """/proc/self/mountinfo in order (a later line is mounted on top of an earlier one)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            out.append(Mount(_unescape(fields[4]), _unescape(fields[sep + 1]), _unescape(fields[sep + 2]), fields[2],
                             _unescape(fields[3])))
    return out


def resolved(path: str, mounts: list[Mount] | None = None) -> str:
    """`path` absolute with its symlinks resolved, without a stat of a mount point itself (an
    lstat of a FUSE mount's root asks its daemon, which may hang): the parent is resolved, and
    the last component only when no mount sits there (a mount point is never a symlink)."""
    parent, name = os.path.split(os.path.abspath(path))
    here = os.path.join(os.path.realpath(parent), name)
    if any(m.point == here for m in (_mounts() if mounts is None else mounts)):
        return here
    return os.path.realpath(here)


def mount_at(path: str) -> Mount | None:
    """The topmost mount on `path` (None when it is not a mount point), from
    /proc/self/mountinfo. Never a stat or listing of the directory itself: those would trigger an
    autofs (x-systemd.automount) mount point, or hang on a stuck daemon."""
    mounts = _mounts()
    target = resolved(path, mounts)
    return next((m for m in reversed(mounts) if m.point == target), None)


def is_alive(point: str) -> bool:
    """Whether the daemon behind a FUSE mount answers. statfs is never cached by the kernel, so
    it reaches the daemon; a dead one gives ENOTCONN ("Transport endpoint is not connected")."""
    try:
        os.statvfs(point)
    except OSError as e:  # EACCES: another user's mount, refused by the kernel itself
        return e.errno not in (errno.ENOTCONN, errno.ECONNABORTED)
    return True


def fusermount(*args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["fusermount3", *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise MetadataError("fusermount3", "not found: install fuse3 (see 'zvfs doctor')") from None


def clear_stale(point: str) -> None:
    log.warning("%s: clearing a stale mount left by a dead daemon", point)
    fusermount("-uz", point)


def check_mountpoint(mountpoint: str, source: str | None = None, opts: MountOptions | None = None) -> None:
    """Refuse a mount point zvfs cannot or should not mount on (MetadataError: one line, exit 2):
    missing, not a directory, a live zvfs mount; and, given the source and options (`zvfs mount`
    runs this before it starts the daemon, and again as the daemon), one that would recurse or
    hide files. A stale zvfs mount left by a killed daemon is cleared.

    Never a stat or listing of what another file system answers for: an autofs mount point
    (x-systemd.automount, which is what runs us) would be triggered, a FUSE mount whose daemon
    hangs would hang us. Such mount points are judged from the mount table alone."""
    mounted = mount_at(mountpoint)
    if mounted is not None and mounted.fstype == FSTYPE:
        if is_alive(mountpoint):
            raise MetadataError(mountpoint, "already mounted (unmount it first: zvfs umount)")
        clear_stale(mountpoint)
        if mount_at(mountpoint) == mounted:
            raise MetadataError(mountpoint, "a stale mount is in the way and fusermount3 -uz could not clear it")
        mounted = mount_at(mountpoint)
    if source is not None:
        _refuse_recursion(source, mountpoint)
    if mounted is not None and (mounted.fstype == "autofs" or mounted.fstype.startswith("fuse")):
        if opts is not None and not opts.nonempty and mounted.fstype != "autofs":
            raise MetadataError(mountpoint, f"{mounted.fstype} from {mounted.source} is mounted there and would be hidden "
                                            "(unmount it, or mount over it with -o nonempty)")
        return
    try:
        st = os.stat(mountpoint)
    except OSError as e:
        problem = "mount point does not exist" if e.errno == errno.ENOENT else f"mount point: {e.strerror}"
        raise MetadataError(mountpoint, problem) from None
    if not stat.S_ISDIR(st.st_mode):
        raise MetadataError(mountpoint, "mount point is not a directory")
    if opts is not None and not opts.nonempty:
        _refuse_hiding(mountpoint)


def _local_path(source: str) -> str | None:
    """The local directory a source names (a path or a file:// URL), None for remote ones."""
    if "://" not in source:
        return source
    try:
        return urllib.parse.unquote(urllib.parse.urlsplit(source).path) if source.startswith("file://") else None
    except ValueError:  # unparseable: opening it fails with its own message
        return None


def _refuse_recursion(source: str, mountpoint: str) -> None:
    """A mount point equal to, inside or above a local source (symlinks resolved) would make the
    daemon read its own mount: `ls` of it hung in D state for good (the daemon's listing thread
    waited on the inode lock the listing held), a mount point inside recursed (`find` showed
    sub/sub/sub/...). Judged by path, then by where each lies in its file system (the mount
    table's device and root: a bind mount shows a directory by another path, and a shared one
    passes mounts on to its peers; outside attackers' sources reached through binds of the
    store, of its parent or of a directory inside it had the mount propagate inside its own
    source, `find` 265 levels deep). Nothing is stat'ed."""
    path = _local_path(source)
    if path is None:
        return
    src, point = os.path.realpath(path), resolved(mountpoint)
    common = os.path.commonpath([src, point])
    if common in (src, point):
        where = "is the source" if src == point else "is inside the source" if common == src else "is above the source"
    else:
        mounts = _mounts()
        src_in, point_in = _in_file_system(src, mounts), _in_file_system(point, mounts)
        if src_in[0] != point_in[0]:
            return
        inner = os.path.commonpath([src_in[1], point_in[1]])
        if inner not in (src_in[1], point_in[1]):
            return
        where = ("is the source" if src_in == point_in else "is inside the source" if inner == src_in[1]
                 else "is above the source")
        where += " (by another path)"
    raise MetadataError(mountpoint, f"mount point {where} {src}: the mount would read itself (choose a directory outside it)")


def _in_file_system(path: str, mounts: list[Mount]) -> tuple[str, str]:
    """(device, path inside that file system) of an absolute, resolved `path`: from the topmost
    mount holding it (a mount on `path` itself included: mounting over it mounts over that
    mount's root, and so over its peers')."""
    best = Mount("/", "", "")
    for m in mounts:
        if (path == m.point or path.startswith(m.point.rstrip("/") + "/")) and len(m.point) >= len(best.point):
            best = m
    return best.device, (best.root.rstrip("/") + path[len(best.point.rstrip("/")):]) or "/"


def _refuse_hiding(mountpoint: str) -> None:
    """Files in the mount point would be hidden while mounted: refused unless -o nonempty
    (rclone's --allow-non-empty; libfuse 3 itself no longer checks)."""
    try:
        with os.scandir(mountpoint) as entries:
            first = next(entries, None)
    except OSError as e:
        raise MetadataError(mountpoint, f"mount point: cannot list it ({e.strerror}); -o nonempty mounts without looking") from None
    if first is not None:
        raise MetadataError(mountpoint, f"mount point is not empty (holds {first.name!r}): its files would be hidden "
                                        "(use an empty directory, or -o nonempty)")


def check_log_target(opts: MountOptions) -> None:
    """A `log=` file that cannot be opened is a usage error before anything is mounted."""
    if opts.log_file:
        try:
            with open(opts.log_file, "a"):
                pass
        except OSError as e:
            raise OptionError(f"log={opts.log_file}: cannot open for appending ({e.strerror})") from None


# --------------------------------------------------------------------------- starting a daemon

#: what to do about failures whose cause is known (matched against the daemon's words)
HINTS = (
    (re.compile(r"user_allow_other"), "add a line 'user_allow_other' to /etc/fuse.conf (as root), or mount without allow_other"),
    (re.compile(r"open /dev/fuse: Permission denied"), "this user cannot open /dev/fuse: make it read-write for users (mode 666, as fuse3 installs it) or mount as root"),
    (re.compile(r"/dev/fuse|modprobe fuse"), "/dev/fuse is missing or not accessible: load the fuse module (modprobe fuse); in a container, pass the device (--device /dev/fuse)"),
    (re.compile(r"Operation not permitted"), "mounting needs root, or a set-uid fusermount3 for users; a container also needs CAP_SYS_ADMIN (see 'zvfs doctor')"),
    (re.compile(r"fusermount3?: (?:failed to exec|not found)|No such file or directory: 'fusermount3'"), "install fuse3 (apt-get install fuse3)"),
    # (the mount point's, as fusermount3 words it: a store the user cannot read says so itself)
    (re.compile(r"(?i)(permission denied|no write access|not owner).*mount ?point|mount ?point.*(permission denied|not owner)"
                r"|fusermount3?: failed to chdir"),
     "mount on a directory you own (or as root); see 'zvfs doctor'"),
)


def explain(error: str, stderr: str) -> str:
    """One line with the error and the daemon's own last words about it, plus a second line
    with a hint when the cause is known."""
    words = [ln.strip() for ln in stderr.splitlines() if ln.strip() and ln.strip() not in error]
    detail = "; ".join(words[-2:])
    text = f"{error}: {detail}" if detail else error
    for pattern, hint in HINTS:
        if pattern.search(stderr) or pattern.search(error):
            return f"{text}\nhint: {hint}"
    return text


def _stop(proc: subprocess.Popen, mountpoint: str) -> None:
    """Stop a daemon that was told to go away (it unmounts on SIGTERM), and clear what a daemon
    that had to be killed leaves."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    mounted = mount_at(mountpoint)
    if mounted is not None and mounted.fstype == FSTYPE and not is_alive(mountpoint):
        clear_stale(mountpoint)


class _ParentInterrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def _raise_interrupt(signum, frame):
    raise _ParentInterrupted(signum)


def spawn_daemon(source: str, mountpoint: str, opts: MountOptions, child_env: dict[str, str]) -> tuple[int, str | None]:
    """Start a foreground `zvfs mount` as a daemon and wait until it reports.

    `child_env` carries the real arguments (see cli); the process title shows the redacted
    source and no options, so credentials never appear in `ps`. SIGINT or SIGTERM while
    waiting stop the daemon, which leaves nothing mounted. Returns (status, error message)."""
    r, w = os.pipe()
    stderr = tempfile.TemporaryFile()
    env = {**os.environ, **child_env, READY_FD_ENV: str(w)}
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    proc = None
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zvfs", "mount", shown(source), mountpoint, "--foreground"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            pass_fds=(w,), env=env, start_new_session=True, cwd="/",
        )
        os.close(w)
        w = None
        line = _wait_ready(r, opts.mount_timeout)
        if line == "ok":
            return 0, None
        if line is None:
            _stop(proc, mountpoint)
            return 1, f"the mount did not come up within {opts.mount_timeout:g} s (nothing mounted)"
        status = proc.wait()
        stderr.seek(0)
        said = stderr.read().decode(errors="replace")
        if line.startswith("error: "):
            return status or 1, explain(line[len("error: "):], said)
        return status or 1, explain(f"the mount daemon exited with status {status} before the mount was live", said)
    except _ParentInterrupted as e:
        if proc is not None:
            _stop(proc, mountpoint)
        return 128 + e.signum, f"{mountpoint}: interrupted by {signal.Signals(e.signum).name}; nothing mounted"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if w is not None:
            os.close(w)
        os.close(r)
        stderr.close()


def _wait_ready(fd: int, timeout: float) -> str | None:
    """The daemon's one-line report ("ok" or "error: ..."), "" if it exited without one, None
    on timeout."""
    deadline = time.monotonic() + timeout
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        # poll, not select: select() refuses descriptors above 1023, which a library caller
        # with many files open reaches.
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if left <= 0 or not poller.poll(left * 1000):
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace").strip()
