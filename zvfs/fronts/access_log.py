"""`zvfs serve`'s access log: hypercorn's default line (`access_log_format`: client, time,
request line, status, length, referer, user agent), formatted directly and written in batches.

hypercorn's own `Logger.access` builds an `AccessLogAtoms` dict per request (every request and
response header, every environment variable, `strftime`), formats its `%`-template, and sends
a record through `logging`, whose file handler `stat`s the file and writes and flushes each
line: 130-190 µs of CPU a request, a quarter to nearly half of the small-file rate
(docs/benchmarks.md). Here a request costs a `LogRecord` with its line already built, and the
records are formatted by the log's own handler (same prefix, same destination as every other
line) and written in one write a second (`flush`), or at `BATCH` lines, and at exit.

A request whose connection closed before its response ended gets its line with `- -` for status
and length, as hypercorn writes it. hypercorn 0.18 also reports that for a response that did end,
when the client closes its connection right after the last byte (curl, a one-request script):
the close is seen while the last body message is being sent, before the stream counts as done,
and the response's own line follows. Such a line waits `UNENDED_WAIT` (until a later write)
and is dropped if the same request's line comes meanwhile: one line per request (with curl, each
request had two, the first saying it never ended).
"""

from __future__ import annotations

import logging
import time

import trio
from hypercorn.logging import Logger

from ..logs import Logs

BATCH = 4096  # lines held at most (about 1 MB) before they are written
FLUSH_EVERY = 1.0  # seconds a line waits at most
#: seconds a request's line without a status waits for the same request's line with one (it
#: follows within a send: both were a millisecond apart in every case seen)
UNENDED_WAIT = 0.25
#: what a client sent that is written escaped, as nginx does (`\xHH`): control characters, `"`,
#: `\` and bytes past ASCII, so that no request can write a line break (a forged log line:
#: an outside attacker's `%0A` in a path) or a NUL into the log
ESCAPED = {c: f"\\x{c:02X}" for c in (*range(0x20), *range(0x7F, 0x100), ord('"'), ord("\\"))}


class AccessLog(Logger):
    """hypercorn's `logger_class` for `zvfs serve`: `Config.accesslog` names the logger whose
    level and name the lines take ("zvfs.access"); `logs` is where they are written."""

    logs: Logs  # (set on a subclass by `logger_class`: hypercorn builds it from the config alone)

    def __init__(self, config) -> None:
        super().__init__(config)
        self.pending: list[logging.LogRecord] = []
        #: lines of requests whose connection closed before the response ended, by request
        #: (the request kept with its line: its id is not reused while it is held)
        self.unended: dict[int, tuple[dict, logging.LogRecord]] = {}
        self._second = -1
        self._stamp = ""

    @classmethod
    def logger_class(cls, logs: Logs) -> type[AccessLog]:
        return type(cls.__name__, (cls,), {"logs": logs})

    async def access(self, request, response, request_time: float) -> None:
        logger = self.access_logger
        if logger is None or not logger.isEnabledFor(logging.INFO):
            return
        now = time.time()
        if int(now) != self._second:  # (strftime once a second, not once a request)
            self._second = int(now)
            self._stamp = time.strftime("[%d/%b/%Y:%H:%M:%S %z]", time.localtime(now))
        client = request.get("client")
        host = f"{client[0]}:{client[1]}" if client and len(client) == 2 else client[0] if client else None
        status = length = "-"
        if response is not None:
            status = str(response["status"])
            length = _header(response.get("headers", ()), b"content-length")
        method = request.get("method", "GET")
        raw = request.get("raw_path")  # (as the request line sent it: "%0A", not a line break)
        path = raw.decode("latin-1") if raw is not None else request["path"]
        line = (f'{host} - - {self._stamp} "{method} {path.translate(ESCAPED)} {request.get("http_version", "ws")}" '
                f'{status} {length} "{_header(request["headers"], b"referer").translate(ESCAPED)}" '
                f'"{_header(request["headers"], b"user-agent").translate(ESCAPED)}"')
        record = logger.makeRecord(logger.name, logging.INFO, "", 0, line, None, None)
        if response is None:
            self.unended[id(request)] = (request, record)
        else:
            held = self.unended.get(id(request))
            if held is not None and held[0] is request:
                del self.unended[id(request)]
            self.pending.append(record)
        if len(self.pending) + len(self.unended) >= BATCH:
            self.flush(final=False)

    def flush(self, final: bool = True) -> None:
        """Write the lines held, in one write (but, unless `final`, those without a status
        younger than `UNENDED_WAIT`)."""
        records, self.pending = self.pending, []
        if self.unended:
            young = time.time() - UNENDED_WAIT
            final = final or len(self.unended) >= BATCH  # (a flood of them: held no longer)
            ended = {k: v for k, v in self.unended.items() if final or v[1].created < young}
            records += [record for _, record in ended.values()]
            records.sort(key=lambda r: r.created)
            self.unended = {k: v for k, v in self.unended.items() if k not in ended}
        if records:
            self.logs.write(records)

    async def flush_every_second(self) -> None:
        while True:
            await trio.sleep(FLUSH_EVERY)
            self.flush(final=False)


def _header(headers, name: bytes) -> str:
    for k, v in headers:
        if k.lower() == name:
            return v.decode("latin-1")
    return "-"
