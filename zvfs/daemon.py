"""Mount lifecycle: open the source, mount, serve, and unmount cleanly on SIGTERM/SIGINT.

`zvfs mount` without `--foreground` starts this same program as a child in its own session
and waits on a pipe until the child says the mount is live (or why it is not): the parent's
exit status means "mounted", which is what mount(8), fstab and scripts need. A child process
(rather than fork) keeps threads and async clients out of the picture. Until the mount is live
the child's stderr goes to a file the parent reads, so libfuse's and fusermount3's own words
about a failed mount reach the terminal. Under systemd (`Type=notify`) the foreground daemon
also sends READY=1.

Signals are caught from the start of the event loop, so SIGTERM or SIGINT while the source is
still opening or the kernel is mounting ends with nothing mounted; SIGHUP only reopens the log
(logrotate).
"""

from __future__ import annotations

import errno
import logging
import logging.handlers
import os
import re
import select
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import pyfuse3
import trio

from .errors import MetadataError, OptionError, ZvfsError
from .fuse_ops import ZvfsOperations
from .options import MountOptions
from .source import open_source
from .storage import redact

log = logging.getLogger("zvfs")

READY_FD_ENV = "ZVFS_READY_FD"
ARGV_ENV = "ZVFS_ARGV"  # the real arguments of a process whose argv was redacted (see cli)
FUSECTL = "/sys/fs/fuse/connections"
FSTYPE = "fuse.zvfs"  # what /proc/self/mountinfo says for our mounts (subtype=zvfs)
SYSLOG = "/dev/log"


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


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_at(path: str) -> Mount | None:
    """The topmost mount on `path` (None when it is not a mount point), from
    /proc/self/mountinfo. Never a stat or listing of the directory itself: those would trigger an
    autofs (x-systemd.automount) mount point, or hang on a stuck daemon."""
    target = os.path.realpath(path)
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if _unescape(fields[4]) == target:  # later lines are mounted on top of earlier ones
                found = Mount(target, _unescape(fields[sep + 1]), _unescape(fields[sep + 2]))
    return found


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


def check_mountpoint(mountpoint: str) -> None:
    """Refuse a missing mount point or a live zvfs mount; clear a stale one left by a killed
    daemon. An autofs mount point is left untouched: systemd's automount is what runs us."""
    mounted = mount_at(mountpoint)
    if mounted is not None and mounted.fstype == FSTYPE:
        if is_alive(mountpoint):
            raise MetadataError(mountpoint, "already mounted (unmount it first: zvfs umount)")
        clear_stale(mountpoint)
        if mount_at(mountpoint) == mounted:
            raise MetadataError(mountpoint, "a stale mount is in the way and fusermount3 -uz could not clear it")
    if mounted is not None and mounted.fstype == "autofs":
        return
    try:
        st = os.stat(mountpoint)
    except OSError as e:
        problem = "mount point does not exist" if e.errno == errno.ENOENT else f"mount point: {e.strerror}"
        raise MetadataError(mountpoint, problem) from None
    if not stat.S_ISDIR(st.st_mode):
        raise MetadataError(mountpoint, "mount point is not a directory")


# --------------------------------------------------------------------------- logs

#: journald's priority prefixes (sd-daemon(3)) by logging level
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}
_TIMESTAMPED = "%(asctime)s zvfs[%(process)d] %(levelname)s %(name)s: %(message)s"


class _JournalFormatter(logging.Formatter):
    """`<3>message`: journald reads the priority from the prefix and adds its own timestamps."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{_PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def _stderr_is_journal() -> bool:
    """systemd sets JOURNAL_STREAM to the device:inode of the stream it connected to stderr."""
    stream = os.environ.get("JOURNAL_STREAM")
    if not stream:
        return False
    st = os.fstat(2)
    return stream == f"{st.st_dev}:{st.st_ino}"


def check_log_target(opts: MountOptions) -> None:
    """A `log=` file that cannot be opened is a usage error before anything is mounted."""
    if opts.log_file:
        try:
            with open(opts.log_file, "a"):
                pass
        except OSError as e:
            raise OptionError(f"log={opts.log_file}: cannot open for appending ({e.strerror})") from None


class Logs:
    """Where the daemon's log goes: `log=FILE` (reopened after logrotate), else stderr in the
    foreground (journald's priority prefixes under systemd), else syslog (journald on systemd
    machines), which is where administrators look for a background daemon."""

    def __init__(self, opts: MountOptions, background: bool):
        self.file = opts.log_file
        self.background = background
        handler: logging.Handler
        if self.file:
            handler = logging.handlers.WatchedFileHandler(self.file)
            handler.setFormatter(logging.Formatter(_TIMESTAMPED))
        elif background:
            handler = logging.handlers.SysLogHandler(SYSLOG, facility=logging.handlers.SysLogHandler.LOG_DAEMON)
            handler.setFormatter(logging.Formatter("zvfs[%(process)d]: %(levelname)s %(name)s: %(message)s"))
        elif _stderr_is_journal():
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(_JournalFormatter("%(name)s: %(message)s"))
        else:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(_TIMESTAMPED))
        self.handler = handler
        logging.raiseExceptions = False  # a log that cannot be written (no syslog) never disturbs the mount
        root = logging.getLogger("zvfs")
        root.handlers[:] = [handler]
        root.setLevel(logging.DEBUG if opts.debug else logging.INFO)
        root.propagate = False

    def detach(self) -> None:
        """Once the mount is live, a background daemon's standard streams leave the parent:
        stdin/stdout to /dev/null, stderr (libfuse writes there) to the log file or /dev/null."""
        devnull = os.open(os.devnull, os.O_RDWR)
        for std in (0, 1):
            os.dup2(devnull, std)
        os.close(devnull)
        self._stderr_to_file()

    def _stderr_to_file(self) -> None:
        fd = os.open(self.file or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 2)
        os.close(fd)

    def reopen(self) -> None:
        """SIGHUP: reopen a log file that logrotate moved away."""
        if isinstance(self.handler, logging.handlers.WatchedFileHandler):
            self.handler.reopenIfNeeded()
            if self.background:
                self._stderr_to_file()
            log.info("log reopened on SIGHUP")


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

    async def on_signals(signals, scope: trio.CancelScope) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:
                logs.reopen()
                continue
            log.info("received %s, unmounting", signal.Signals(signum).name)
            state["signal"] = signum
            if state["serving"]:
                pyfuse3.terminate()  # main() returns, the finally below unmounts
            else:
                scope.cancel()  # still opening or mounting
            return

    async def mount_and_serve(nursery: trio.Nursery) -> None:
        try:
            opened = await open_source(source, opts)
        except (OSError, ValueError) as e:  # what backends raise for unusable URLs and hosts
            raise MetadataError(shown(source), f"cannot open: {e.strerror if isinstance(e, OSError) and e.strerror else e}") from None
        mounted = False
        try:
            ops = ZvfsOperations(opened.tree, opened.control(), opened.root_mode, opts.uid, opts.gid, opts.umask)
            pyfuse3.init(ops, mountpoint, _fuse_options(source, opts))
            mounted = True
            log.info("mounted %s on %s (%s view)", opened.store.display, mountpoint, opened.view)
            await trio.lowlevel.checkpoint()  # a signal that came during the mount is seen here
            ready.send(None)
            if logs.background:
                logs.detach()
            nursery.start_soon(_tune_connection, mountpoint, opts.max_background)
            state["serving"] = True
            await pyfuse3.main()
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


# --------------------------------------------------------------------------- starting a daemon

#: what to do about failures whose cause is known (matched against the daemon's words)
HINTS = (
    (re.compile(r"user_allow_other"), "add a line 'user_allow_other' to /etc/fuse.conf (as root), or mount without allow_other"),
    (re.compile(r"open /dev/fuse: Permission denied"), "this user cannot open /dev/fuse: make it read-write for users (mode 666, as fuse3 installs it) or mount as root"),
    (re.compile(r"/dev/fuse|modprobe fuse"), "/dev/fuse is missing or not accessible: load the fuse module (modprobe fuse); in a container, pass the device (--device /dev/fuse)"),
    (re.compile(r"Operation not permitted"), "mounting needs root, or a set-uid fusermount3 for users; a container also needs CAP_SYS_ADMIN (see 'zvfs doctor')"),
    (re.compile(r"fusermount3?: (?:failed to exec|not found)|No such file or directory: 'fusermount3'"), "install fuse3 (apt-get install fuse3)"),
    (re.compile(r"(?i)permission denied|no write access|not owner"), "mount on a directory you own (or as root); see 'zvfs doctor'"),
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
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace").strip()
