"""Where a long-running zvfs process logs (the FUSE daemon, `zvfs serve`): `log=FILE`
(reopened after logrotate on SIGHUP), else stderr in the foreground (with journald's priority
prefixes under systemd), else syslog, which is where administrators look for a background
daemon."""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys

from .options import MountOptions

log = logging.getLogger("zvfs")

SYSLOG = "/dev/log"

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

    def write(self, records: list[logging.LogRecord]) -> None:
        """Records formatted as the log formats every line, written in one write (the access log
        of `zvfs serve`: one write a line cost as much CPU as the request it recorded). A
        foreground process's log is a stream: `log=FILE` or stderr."""
        handler = self.handler
        assert isinstance(handler, logging.StreamHandler) and not self.background
        try:
            text = "".join(handler.format(record) + handler.terminator for record in records)
            with handler.lock:  # type: ignore[union-attr]
                if isinstance(handler, logging.handlers.WatchedFileHandler):
                    handler.reopenIfNeeded()
                handler.stream.write(text)
                handler.stream.flush()
        except (OSError, ValueError):  # (a log that cannot be written never disturbs the server)
            pass

    def reopen(self) -> None:
        """SIGHUP: reopen a log file that logrotate moved away."""
        if isinstance(self.handler, logging.handlers.WatchedFileHandler):
            self.handler.reopenIfNeeded()
            if self.background:
                self._stderr_to_file()
            log.info("log reopened on SIGHUP")
