"""Any fsspec filesystem (HTTP, S3, GCS, memory, ...) as a store, with versions and deadlines.

Every answer is checked before its bytes are used, because a server that lies makes zvfs lie
(issue 10: a server that ignores Range made 60 of 60 chunk files wrong with no error):

* HTTP(S): the GET is made here, on fsspec's own aiohttp session, so status and headers are
  seen. A 206 must carry a Content-Range that is exactly the range asked for (shorter only at
  the end of the object) and a body of that length; a 200 to a range request is the whole
  object: its slice is served when it is of the expected version and its Content-Length says
  it is at most `WHOLE_BODY_LIMIT` bytes (only the bytes up to the end of the range are read),
  else the read fails at once. Redirects are followed here too, at most
  `MAX_REDIRECTS`, and credentials (userinfo of the URL, Authorization, cookies) are never sent
  to another origin. A query string of the source URL (signed URLs, tokens) is kept on every
  key's URL.
* S3: s3fs's `get_object` call with `Range` and `IfMatch` (its ContentRange, ETag and
  LastModified give the version).
* GCS: the GET is made here too, on gcsfs's session with gcsfs's URL and auth headers, and
  checked as HTTP's; the version is the object's generation (`x-goog-generation`), sent back
  as `ifGenerationMatch`.
* other backends (memory, ...): a generic fallback takes the version from `info` before
  the read; a replacement between the two calls is not seen (these backends do not give the
  headers of the read itself).

Every body (HTTP, S3, GCS) is read in pieces with its expected length as a hard limit and an
encoded one is refused (`answer_body`): what a server sends can never grow the daemon past
the bytes asked for.

The version (size from Content-Range's total, ETag, else Last-Modified) of every answer is kept
per key (`current`, no request) and compared with what a read expects: bytes of another
version raise `ShardChanged`, never reach the caller. A strong ETag is also sent as If-Match,
so a changed object costs a 412, not its bytes.

Deadlines are real (issue 12): one read returns or fails within `deadline + request_timeout`
seconds, whatever the server does (stalls, throttling, resets), including time spent waiting
for one of the `max_requests` slots. Each attempt is cut at `request_timeout` here (gcsfs has
its own fixed retry loop that ignores ours; s3fs's is reduced to one attempt); transient faults
(5xx, 408, 429, S3 throttling, resets, timeouts, cut bodies) are retried with jittered
exponential backoff (50 ms doubling to 2 s) in `stamina`'s trio-aware retry loop until
`deadline`; a retry that could only start after the deadline is not made. Everything else
fails at once, as one `StorageError` (EIO for that file; nothing is cached, so the next read tries
again, but for `FAILURE_MEMORY` seconds after a key was left unanswered). While the store is
stalled (a call left unanswered), calls made meanwhile end by that call's deadline, or after a
short probe once it has passed (`FsspecStore._run`): the kernel's own retries, and readers
queued behind it, do not each wait a whole deadline. A missing key is not a fault: it is None.
"""

from __future__ import annotations

import asyncio
import codecs
import datetime
import email.utils
import itertools
import logging
import random
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import quote, unquote, urljoin, urlsplit

import stamina
import trio

from ..errors import ShardChanged, StorageError
from .base import VERSIONS_KEPT, CountedListing, Entry, ListingBudget, SeenVersions, Store, Version

log = logging.getLogger("zvfs.storage")
#: stamina logs a bare "stamina.retry_scheduled" warning per retry; ours (debug) names the key
stamina.instrumentation.set_on_retry_hooks([])

T = TypeVar("T")
MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError)
#: S3 error codes that mean "slow down and try again"
THROTTLING = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
              "RequestTimeout", "InternalError", "ServiceUnavailable"}
#: Backoff between attempts: 50 ms doubling to 2 s plus up to 50 ms of jitter, so that many
#: readers failing together do not retry in lockstep.
BACKOFF_FIRST, BACKOFF_MAX, BACKOFF_JITTER = 0.05, 2.0, 0.05
#: Largest whole-object answer (a 200 to a range request) whose slice is served: a server that
#: ignores Range costs the whole object per read, which is bearable for small objects only.
WHOLE_BODY_LIMIT = 64 << 20
MAX_REDIRECTS = 5
#: Stalls (`FsspecStore._run`): a call left unanswered after SLOW_FAILURE seconds or more
#: (or during a stall) is answered with the same failure, at once, for FAILURE_MEMORY
#: seconds, and begins a stall; it lasts GRACE past its deadline; calls made after that
#: deadline wait for a probe of PROBE_MIN to PROBE_MAX seconds.
SLOW_FAILURE, FAILURE_MEMORY, GRACE = 0.25, 0.5, 1.0
PROBE_MIN, PROBE_MAX = 0.05, 0.5
#: Headers that carry credentials: dropped when a redirect leads to another origin.
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie")
CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


class HttpStatus(Exception):
    """An HTTP answer that is neither data nor "absent" (its `status` drives retrying)."""

    def __init__(self, status: int, url: str):
        super().__init__(f"HTTP {status}")
        self.status = status
        self.url = url


class BadAnswer(StorageError):
    """An answer that does not fit the request (wrong Content-Range, wrong length, a whole
    object too large to slice): never served, not retried (the server does it every time)."""


class Unanswered(StorageError):
    """No answer within the store's bound: the request timed out, or transient faults lasted
    until the deadline (what begins a stall: `FsspecStore._run`)."""


def _status(e: BaseException) -> int | None:
    status = getattr(e, "status", None)
    if isinstance(status, int):
        return status
    response = _boto_response(e)
    if response is not None:
        return response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return None


def _boto_response(e: BaseException | None) -> dict | None:
    """botocore's error response, also behind s3fs's translated exceptions (their cause)."""
    for err in (e, getattr(e, "__cause__", None)):
        response = getattr(err, "response", None)
        if isinstance(response, dict):
            return response
    return None


def _s3_code(e: BaseException) -> str | None:
    response = _boto_response(e)
    return None if response is None else response.get("Error", {}).get("Code")


def transient(e: BaseException) -> bool:
    """Worth retrying: server errors, throttling, and faults of the connection itself."""
    if isinstance(e, (StorageError, ShardChanged, *MISSING)):
        return False
    if _s3_code(e) in THROTTLING:
        return True
    status = _status(e)
    if status is not None:
        return status >= 500 or status in (408, 429)
    if isinstance(e, (TimeoutError, ConnectionError)):
        return True
    name = type(e).__name__
    return any(word in name for word in ("Timeout", "Connection", "Disconnected", "Payload", "EndpointConnection",
                                         "IncompleteRead", "ResponseParser"))


def range_header(start: int, length: int | None) -> str | None:
    """The Range header value for `Store.read`'s (start, length), None for the whole object."""
    if start < 0:
        return f"bytes=-{-start}"
    if length is None:
        return f"bytes={start}-" if start else None
    return f"bytes={start}-{start + length - 1}"


def slice_answer(url: str, partial: bool, content_range: str | None, body: bytes, start: int, length: int | None,
                 total: int | None = None) -> tuple[bytes, int | None]:
    """The requested bytes out of an answer, and the object's size; `BadAnswer` when the answer
    does not fit the request. `partial`: a 206 (with `content_range`); otherwise `body` is the
    whole object (`total` is then its announced size, if any)."""
    if not partial:
        if total is not None and total != len(body):
            raise BadAnswer(f"{url}: whole-object answer of {len(body)} bytes, announced {total}")
        size = len(body)
        if start < 0:
            return body[max(0, size + start):], size
        return body[start:] if length is None else body[start:start + length], size
    m = CONTENT_RANGE.match(content_range or "")
    if not m:
        raise BadAnswer(f"{url}: partial answer without a usable Content-Range ({content_range!r})")
    first, last = int(m.group(1)), int(m.group(2))
    size = None if m.group(3) == "*" else int(m.group(3))
    if start < 0:
        if size is None:
            raise BadAnswer(f"{url}: suffix answer without the object's size ({content_range!r})")
        want_first, want_last = max(0, size + start), size - 1
    else:
        want_first = start
        want_last = start + length - 1 if length is not None else (size - 1 if size is not None else last)
        if size is not None:
            want_last = min(want_last, size - 1)
    if (first, last) != (want_first, want_last) and not (size is None and first == want_first and last <= want_last):
        raise BadAnswer(f"{url}: asked for bytes {want_first}-{want_last}, answer says {first}-{last}")
    if len(body) != last - first + 1:
        raise BadAnswer(f"{url}: Content-Range {first}-{last} but {len(body)} bytes of body")
    return body, size


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def datetime_ns(when: datetime.datetime) -> int:
    """Nanoseconds since the epoch, exactly (to the microsecond a datetime holds); a naive
    datetime is taken as UTC (HTTP dates and S3's LastModified are)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return (when - _EPOCH) // datetime.timedelta(microseconds=1) * 1000


def http_version(headers, size: int) -> Version:
    """The version an HTTP answer describes: its ETag, else its Last-Modified."""
    etag, modified = headers.get("ETag"), headers.get("Last-Modified")
    mtime_ns = None
    if modified:
        try:
            mtime_ns = datetime_ns(email.utils.parsedate_to_datetime(modified))
        except (TypeError, ValueError):
            pass
    tag = ("etag", etag) if etag else (("last-modified", modified) if modified else ())
    return Version(size, tag, mtime_ns)


def gcs_version(headers, size: int) -> Version:
    """The version a GCS answer describes: the object's generation (else as for HTTP)."""
    version = http_version(headers, size)
    generation = headers.get("x-goog-generation")
    return Version(size, ("generation", generation), version.mtime_ns) if generation else version


def strong_etag(version: Version | None) -> str | None:
    """The ETag to send as If-Match (weak ETags never match a strong comparison)."""
    if version is None or len(version.tag) != 2 or version.tag[0] != "etag":
        return None
    etag = version.tag[1]
    return None if etag.startswith("W/") else etag


class FsspecStore(Store):
    def __init__(self, fs, root: str, display: str, max_requests: int = 16, deadline: float = 30.0,
                 request_timeout: float = 20.0, max_listing: int | None = None):
        self.fs = fs
        self.listing_budget = ListingBudget(max_listing)
        self.display = display
        self.deadline = deadline
        self.request_timeout = request_timeout
        self.patience = deadline + request_timeout  # every call ends within it (`_run`)
        self._limiter = trio.CapacityLimiter(max_requests)
        self._listings = trio.CapacityLimiter(max(1, max_requests - max(1, max_requests // READ_SHARE)))
        protocols = _protocols(fs)
        self.http = any(p in ("http", "https") for p in protocols)
        self.s3 = any(p in ("s3", "s3a") for p in protocols)
        self.gcs = any(p in ("gs", "gcs") for p in protocols)
        # a query string (signed URLs, tokens) stays at the end of every key's URL
        self.query = ""
        if self.http and "?" in root:
            root, self.query = root.split("?", 1)
        self.root = root.rstrip("/")
        if self.s3:
            fs.retries = 1  # s3fs retries 5 times with its own sleeps by default: ours only
        #: async backends (HTTP, S3, GCS) run their coroutines on fsspec's own event loop
        #: thread: submit to it directly instead of through a worker thread (one hop, not two)
        self._loop = getattr(fs, "loop", None) if getattr(fs, "async_impl", False) else None
        self._versions = SeenVersions()
        self._failed: dict[str, tuple[float, str]] = {}  # key -> (until when, message): `_run`
        self._stall: tuple[float, float] | None = None  # (when its first call began, until when)
        self._typical = PROBE_MIN / 4  # seconds a call that succeeds takes (moving average)
        #: sizes of keys seen in listings (gcsfs and s3fs list them), for `_known_size`
        self._listed: OrderedDict[str, int] = OrderedDict()
        self.retries = 0

    def _path(self, key: str) -> str:
        """The fsspec path of `key`; for HTTP its URL, the key percent-encoded (a key is any
        name: unencoded, `%41` asked for `A`, `a?b` for `a` with a query, `a#b` for `a`; an
        outside attacker read another object through each). Names that are not UTF-8 come
        from listings as surrogate escapes and go back as the bytes they were."""
        if self.http and key:
            key = quote(key, safe="/", errors="surrogateescape")
        path = f"{self.root}/{key}" if key else self.root
        return f"{path}?{self.query}" if self.query else path

    # -- calls with deadlines and retries

    async def _run(self, key: str, attempt: Callable[[], Awaitable[T]], listing: bool = False) -> T:
        """`_call` within the store's bound, or, while the store is stalled, within the stall's.

        A reader does not wait only for its own call: the kernel reads a page again, at once
        and synchronously, when its read-ahead failed (every read of a chunk file of a stalled
        store cost two deadlines: 4.3 s against a bound of 3); it serves the lookups of one
        directory one at a time (16 readers of one directory: the last after 33 s); and it
        sends at most `max_background` reads at a time (200 readers: 6.2-9.2 s). Hence:

        * a call left `Unanswered` after `SLOW_FAILURE` or more, or during a stall, is answered
          with the same failure, at once, for the next `FAILURE_MEMORY` seconds (a wrong
          answer or a refusal is not remembered: it is the server's answer, not a stall);
        * such a slow failure begins a *stall*: calls made during it end by its first call's
          deadline (start + deadline + request_timeout) or, once that has passed, after a
          short probe (`PROBE_MIN`-`PROBE_MAX`: four times a call that succeeds). It ends
          `GRACE` after that deadline, or after the last failure of a call made during it
          (probes prolong it to twice the bound at most: a store that came back slower than
          a probe is given whole deadlines again). Calls made meanwhile that succeed are
          served; one that is slower than its probe is EIO once.

        Without the memory, each of 16 lookups queued in one directory paid a probe (the last
        ended after 4.4 s against a bound of 3); with it, 3.2 s.

        A `listing` (a page of one) is bounded by a stall, and its failure remembered, but
        it neither begins nor prolongs one, nor counts in the typical call: a page that
        outlasts the request timeout is its own failure (a large or slow page), not a sign that
        the server stopped answering. Before, one began a stall, and in a loaded run a read
        that took longer than its probe was EIO.
        """
        now = trio.current_time()
        failed = self._failed.get(key)
        if failed is not None:
            if now < failed[0]:
                raise Unanswered(failed[1])
            del self._failed[key]
        bound = self.deadline + self.request_timeout
        until = now + bound
        stall = self._stall
        if stall is not None and now < stall[1]:
            until = min(until, max(stall[0] + bound, now + min(PROBE_MAX, max(PROBE_MIN, 4 * self._typical))))
        try:
            result = await self._call(key, attempt, until)
        except Unanswered as e:
            self._failed_after(key, now, bound, e, listing)
            raise
        if not listing:
            self._typical += (trio.current_time() - now - self._typical) / 8
        return result

    def _failed_after(self, key: str, start: float, bound: float, e: Unanswered, listing: bool) -> None:
        """Begin or prolong a stall (not for a `listing`), and remember the failure, after a
        call made at `start` was left unanswered (`_run`)."""
        end = trio.current_time()
        stall = self._stall
        if stall is not None and start < stall[1]:  # a call made during the stall
            if not listing and (end - start >= SLOW_FAILURE or start >= stall[0] + bound):
                self._stall = (stall[0], min(max(stall[1], end + GRACE), stall[0] + 2 * bound))
        elif end - start >= SLOW_FAILURE:
            if not listing:
                self._stall = (start, max(start + bound, end) + GRACE)
        else:
            return  # a quick failure: the next call tries again
        if len(self._failed) >= VERSIONS_KEPT:
            self._failed = {k: v for k, v in self._failed.items() if v[0] > end}
            if len(self._failed) >= VERSIONS_KEPT:
                self._failed.clear()
        self._failed[key] = (end + FAILURE_MEMORY, str(e))

    async def _call(self, key: str, attempt: Callable[[], Awaitable[T]], until: float) -> T:
        """One backend call under the concurrency limit, retried inside the deadline; the
        whole call, waiting for a slot included, ends by `until` (at most deadline +
        request_timeout from now)."""
        last: list[BaseException] = []
        now = trio.current_time()
        give_up = min(now + self.deadline, until)

        def retry(e: Exception) -> bool | float:
            """False (fail now) or the backoff before the next attempt: a retry that could only
            start after the deadline is not made (measured: sleeping into it made a read of a
            backend answering 503 take 3.4 s against a 2 s deadline)."""
            if not transient(e):
                return False
            wait = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** len(last)) + random.uniform(0, BACKOFF_JITTER)
            if trio.current_time() + wait >= give_up:
                return False
            last.append(e)
            self.retries += 1
            log.debug("%s/%s: %s, retrying in %.2f s", self.display, key, _describe(e), wait)
            return wait

        try:
            with trio.fail_at(until):
                async for tries in stamina.retry_context(on=retry, attempts=None, timeout=max(give_up - now, 0.001)):
                    with tries:
                        async with self._limiter:
                            try:
                                with trio.fail_after(self.request_timeout):
                                    return await attempt()
                            except trio.TooSlowError:
                                raise TimeoutError(f"no answer within {self.request_timeout:g} s") from None
        except trio.TooSlowError:
            if until < now + self.deadline + self.request_timeout:
                raise Unanswered(f"{self.display}/{key}: no answer while the store is stalled") from None
            why = f"; last: {_describe(last[-1])}" if last else ""
            raise Unanswered(f"{self.display}/{key}: no answer within "
                             f"{self.deadline + self.request_timeout:g} s{why}"[:300]) from None
        except (StorageError, ShardChanged, *MISSING):
            raise
        except Exception as e:
            error = _storage_error(self.display, key, e)
            raise (Unanswered(str(error)) if transient(e) else error) from e
        raise AssertionError("unreachable")  # pragma: no cover

    async def _backend(self, coro: Callable[[], Awaitable[T]], sync: Callable[[], T]) -> T:
        if self._loop is None:
            return await trio.to_thread.run_sync(sync, abandon_on_cancel=True)
        return await _on_loop(self._loop, coro)

    # -- versions

    async def current(self, key: str) -> Version | None:
        return self._versions.get(key)

    def _known_size(self, key: str) -> int | None:
        """The key's size as last seen, in an answer or a listing (no request); None if not seen."""
        version = self._versions.get(key)
        return version.size if version is not None else self._listed.get(key)

    # -- Store

    async def read(self, key: str, start: int = 0, length: int | None = None, extent: int | None = None,
                   expect: Version | None = None) -> bytes | None:
        if length == 0:
            return b""
        data, version = await self.read_version(key, start, length, expect=expect)
        if expect is not None:
            check_version(key, expect, version, data)
        return data

    async def read_version(self, key: str, start: int = 0, length: int | None = None,
                           expect: Version | None = None) -> tuple[bytes | None, Version | None]:
        """`Store.read_version`; `expect` (an extension used by `read`) sends If-Match."""
        if length == 0:
            return b"", self._versions.get(key)
        if start < 0 and (known := self._known_size(key)):
            # No suffix range where the size is known: servers may ignore one and send the
            # whole object (gcp-storage-emulator does, with a 200), which costs a shard's bytes
            # for its index (an error past WHOLE_BODY_LIMIT). The answer's size says whether
            # the object still has the size assumed; if not, the suffix range itself is asked.
            first = max(0, known + start)
            data, version = await self.read_version(key, first, known - first, expect=expect)
            if data is None or (version is not None and version.size == known):
                return data, version
        path = self._path(key)
        if self.http:
            call = lambda: _on_loop(self._loop, lambda: self._http_get(key, path, start, length, expect))
        elif self.s3:
            call = lambda: _on_loop(self._loop, lambda: self._s3_get(key, path, start, length, expect))
        elif self.gcs:
            call = lambda: _on_loop(self._loop, lambda: self._gcs_get(key, path, start, length, expect))
        else:
            call = lambda: self._backend(lambda: self._generic_get_async(path, start, length),
                                         lambda: self._generic_get(path, start, length))
        try:
            data, version = await self._run(key, call)
        except MISSING:
            data, version = None, None
        except ShardChanged:
            self._versions.pop(key, None)  # the next open learns the new version
            raise
        self._versions.seen(key, version)
        return data, version

    async def size(self, key: str) -> int | None:
        path = self._path(key)
        if self.http or self.gcs or self.s3:  # (versions of one form: from the answers to reads, which
            # an open compares with the version a read expects: a HEAD's for S3 differed)
            _, version = await self.read_version(key, 0, 1)
            return None if version is None else version.size
        try:
            info = await self._run(key, lambda: self._backend(lambda: self.fs._info(path), lambda: self.fs.info(path)))
        except MISSING:
            return None
        if info.get("type") == "directory":
            return None
        self._versions.seen(key, generic_version(info))
        return int(info["size"])

    async def list(self, prefix: str) -> list[Entry] | None:
        """The names under `prefix`, None if there is nothing there (or it is a key). Held within
        the listing budget as they come, as a local store's (`CountedListing`): HTTP index pages and
        S3 and GCS listings are read a piece or a page at a time, so a directory past the
        budget is DirectoryTooLarge before it is all read (issue 22: an index page that never
        ended took the daemon to 853 MiB under memory=64M, one of a million links to 609 MiB).
        Other fsspec backends list whole, then are counted.

        Listings under way leave a `READ_SHARE`th of the request slots to reads, waiting for
        their turn besides their deadline (an outside attacker's 40 listings of slow index pages
        at once took every slot and held reads of other files up 7.6-9.7 s). Not fewer
        listings at once: an array's chunk listing lists its row directories together."""
        async with self._listings:
            return await self._list(prefix)

    async def _list(self, prefix: str) -> list[Entry] | None:
        if self.http:
            return await self._http_list(prefix)
        path = self._path(prefix)
        if self.s3 or self.gcs:
            try:
                found = await (self._s3_list if self.s3 else self._gcs_list)(prefix, path)
            except MISSING:
                return None
            return found or None  # (object stores have no empty directories)
        try:
            infos = await self._run(prefix, lambda: self._backend(lambda: self.fs._ls(path, detail=True),
                                                                  lambda: self.fs.ls(path, detail=True)), listing=True)
        except MISSING:
            return None
        if len(infos) == 1 and infos[0].get("type") == "file" and infos[0]["name"].rstrip("/") == path:
            return None  # a key, not a prefix
        with CountedListing(self.listing_budget, f"{self.display}/{prefix}") as out:
            for info in infos:
                if info["name"].rstrip("/") != path:
                    self._add_info(out, prefix, info)
            return out.entries()

    def _add_info(self, out: CountedListing, prefix: str, info: dict) -> None:
        """One fsspec info dict of a listing of `prefix`, into `out` (its size kept for `_known_size`)."""
        name = info["name"].rstrip("/").rsplit("/", 1)[-1]
        if not name:
            return
        is_dir = info.get("type") == "directory"
        size = info.get("size")
        out.add(name, is_dir, 0 if is_dir else (None if size is None else int(size)))
        if not is_dir and size is not None:
            self._listed[f"{prefix.strip('/')}/{name}".lstrip("/")] = int(size)
            if len(self._listed) > VERSIONS_KEPT:
                self._listed.popitem(last=False)

    async def _s3_list(self, prefix: str, path: str) -> list[Entry]:
        """A listing of `prefix` a page at a time (list_objects_v2 with a delimiter: 1,000 keys
        a page, each page a call of its own with its own timeout and retries: 30 pages of 1 s
        were EIO at the 20 s that bounded them together); not kept in s3fs's listings cache."""
        bucket, key, _ = self.fs.split_path(path)
        kw = {"Bucket": bucket, "Prefix": f"{key.rstrip('/')}/" if key else "", "Delimiter": "/"}
        with CountedListing(self.listing_budget, f"{self.display}/{prefix}") as out:
            while True:
                page = await self._run(prefix, lambda: _on_loop(self._loop, lambda: self.fs._call_s3("list_objects_v2", **kw)),
                                       listing=True)
                for sub in page.get("CommonPrefixes", []):
                    self._add_info(out, prefix, {"name": sub["Prefix"], "type": "directory"})
                for item in page.get("Contents", []):
                    if item["Key"] != kw["Prefix"]:  # (an object named as the directory: a "folder" marker)
                        self._add_info(out, prefix, {"name": item["Key"], "type": "file", "size": item.get("Size")})
                if not page.get("IsTruncated"):
                    return out.entries()
                kw["ContinuationToken"] = page["NextContinuationToken"]

    async def _gcs_list(self, prefix: str, path: str) -> list[Entry]:
        """A listing of `prefix` a page at a time (the JSON API's objects.list with a
        delimiter, 1,000 names a page through gcsfs's `_call_list_objects`, each page a call of
        its own, as S3's)."""
        bucket, key, _ = self.fs.split_path(path)
        where = f"{key.rstrip('/')}/" if key else None
        token = None
        with CountedListing(self.listing_budget, f"{self.display}/{prefix}") as out:
            while True:
                page = await self._run(prefix, lambda: _on_loop(self._loop, lambda: self.fs._call_list_objects(
                    bucket, delimiter="/", prefix=where, maxResults=1000, pageToken=token)), listing=True)
                for sub in page.get("prefixes", []):
                    self._add_info(out, prefix, {"name": sub, "type": "directory"})
                for item in page.get("items", []):
                    if item["name"] != where:
                        self._add_info(out, prefix, {"name": item["name"], "type": "file", "size": item.get("size")})
                token = page.get("nextPageToken")
                if not token:
                    return out.entries()

    async def _http_list(self, prefix: str) -> list[Entry] | None:
        """The links of a directory's index page (nginx autoindex, Apache, S3 website...)."""
        base = self._path(prefix).split("?", 1)[0].rstrip("/") + "/"
        url = base + (f"?{self.query}" if self.query else "")
        try:
            return await self._run(prefix, lambda: _on_loop(self._loop, lambda: self._http_index(prefix, url, base)),
                                   listing=True)
        except MISSING:
            return None

    async def _http_index(self, prefix: str, url: str, base: str) -> list[Entry]:
        """One GET of an index page (on fsspec's loop), parsed as it arrives, a piece at a time:
        the names it links to below `base` are counted in the listing budget as they are found,
        and the page itself is never held (the links that start in the last `LINK_MAX`
        characters of a piece are taken with the next: one that a piece's end cuts would match
        as a prefix of its URL; a name found twice is listed once). The listing counts its
        working memory besides (a piece, its text and the overlap). The links are those
        fsspec's HTTP listing finds (its patterns: `<a href=...>` and bare http(s) URLs),
        joined to the page's URL as a browser does. (Issue 22: a page held whole, then parsed, took the daemon to 853 MiB under
        memory=64M for a page that never ended; held within the budget while it arrived, 16
        such pages listed at once took it to 417 MiB, fragments of the pages held for a while.)"""
        from fsspec.implementations.http import ex, ex2

        with CountedListing(self.listing_budget, f"{self.display}/{prefix}") as out:
            out.count(4 * PIECE + 4 * LINK_MAX, "(its index page's pieces)")
            async with _on_asyncio(self._http_open("GET", url, {"Accept-Encoding": "identity"})) as r:
                if r.status in (404, 410):
                    raise FileNotFoundError(url)
                if r.status != 200:
                    raise HttpStatus(r.status, _redact_url(url))
                encoding = r.headers.get("Content-Encoding")
                if encoding and encoding.strip().lower() != "identity":
                    raise BadAnswer(f"{_redact_url(url)}: the index page is encoded (Content-Encoding: {encoding[:40]})")
                if r.headers.get("Content-Type", "text/html").partition(";")[0].strip().lower() != "text/html":
                    return []
                origin, base_path = urlsplit(base)[1:3]
                decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
                tail = ""
                while True:
                    part = await r.content.read(PIECE)
                    text = tail + decoder.decode(part, final=not part)
                    # links that start in the last LINK_MAX characters are taken with the next
                    # piece (a link the piece's end cuts matches as a prefix of its URL)
                    taken = len(text) if not part else max(0, len(text) - LINK_MAX)
                    for found, m in enumerate(itertools.chain(*(itertools.takewhile(lambda m: m.start() < taken, p.finditer(text))
                                                                for p in (ex2, ex)))):
                        if found % LINKS_AT_ONCE == LINKS_AT_ONCE - 1:
                            await asyncio.sleep(0)  # (the loop's other requests go on)
                        href = m.group("url")
                        if PLAIN_HREF.match(href):  # a name below the page, as autoindex links (2 us, not 14)
                            rel = href
                        else:
                            joined = urlsplit(urljoin(url, href))
                            if joined.netloc != origin or not joined.path.startswith(base_path):
                                continue  # (another host's, or not below the page)
                            rel = joined.path[len(base_path):]
                        # index pages link to quoted names ("1%3A0"), of any bytes
                        name = unquote(rel.split("/", 1)[0], errors="surrogateescape")
                        if name and name not in (".", ".."):
                            out.add(name, "/" in rel, 0 if "/" in rel else None)
                    if not part:
                        return out.entries()
                    tail = text[taken:]

    # -- HTTP(S)

    async def _http_get(self, key: str, url: str, start: int, length: int | None, expect: Version | None):
        """One GET of a range (on fsspec's loop): (bytes, version) or (None, None) if absent."""
        headers = {"Accept-Encoding": "identity"}  # the stored bytes, never re-encoded ones
        wanted = range_header(start, length)
        if wanted:
            headers["Range"] = wanted
        etag = strong_etag(expect)
        if etag:
            headers["If-Match"] = etag
        async with _on_asyncio(self._http_open("GET", url, headers)) as r:
            return await http_answer(key, _redact_url(url), r, start, length, http_version)

    async def _http_open(self, method: str, url: str, headers: dict):
        """The response to METHOD url (redirects followed here, credentials kept to the
        origin they were given for). The caller releases it."""
        import aiohttp
        import yarl

        kw = dict(self.fs.kwargs)
        headers = {**kw.pop("headers", {}), **headers}
        auth = kw.pop("auth", None)
        kw.pop("allow_redirects", None)
        target = yarl.URL(url, encoded=getattr(self.fs, "encoded", False))
        if target.user is not None:
            auth = auth or aiohttp.BasicAuth(target.user or "", target.password or "")
            target = target.with_user(None)
        session = await self.fs.set_session()
        for _ in range(MAX_REDIRECTS + 1):
            r = await session.request(method, target, headers=headers, auth=auth, allow_redirects=False,
                                      auto_decompress=False, **kw)
            location = r.headers.get("Location")
            if r.status not in (301, 302, 303, 307, 308) or not location:
                return r
            r.release()
            nxt = target.join(yarl.URL(location))
            if nxt.origin() != target.origin():  # another host, port or scheme: no credentials
                auth = None
                headers = {k: v for k, v in headers.items() if k.lower() not in CREDENTIAL_HEADERS}
                kw.pop("cookies", None)
            target = nxt.with_user(None)
        raise BadAnswer(f"{_redact_url(url)}: more than {MAX_REDIRECTS} redirects")

    # -- S3

    async def _s3_get(self, key: str, path: str, start: int, length: int | None, expect: Version | None):
        """One ranged get_object (on fsspec's loop): (bytes, version) or absent."""
        bucket, name, _ = self.fs.split_path(path)
        kw = {"Bucket": bucket, "Key": name}
        wanted = range_header(start, length)
        if wanted:
            kw["Range"] = wanted
        etag = strong_etag(expect)
        if etag:
            kw["IfMatch"] = etag
        try:
            resp = await self.fs._call_s3("get_object", **kw)
        except OSError as e:
            code = _s3_code(e)
            if code in ("PreconditionFailed", "412"):
                raise ShardChanged(key, "changed while mounted (412 on If-Match)") from None
            if code in ("InvalidRange", "416"):
                head = await self.fs._call_s3("head_object", Bucket=bucket, Key=name)
                return b"", s3_version(head, int(head["ContentLength"]))
            raise
        content_range = resp.get("ContentRange")
        async with resp["Body"] as stream:
            data, size = await answer_body(f"s3://{bucket}/{name}", content_range is not None, content_range,
                                           resp.get("ContentLength"), resp.get("ContentEncoding"), stream.read,
                                           start, length)
        return data, s3_version(resp, size)

    # -- GCS

    async def _gcs_get(self, key: str, path: str, start: int, length: int | None, expect: Version | None):
        """One GET of a range from GCS's JSON API (on fsspec's loop), made here on gcsfs's own
        session with its URL and auth headers (gcsfs's `_cat_file` reads whole bodies and shows
        no headers): (bytes, version) or absent. The version is the object's generation; a
        generation expected is sent as `ifGenerationMatch` (a 412 if it changed)."""
        headers = {"Accept-Encoding": "identity"}  # GCS serves gzip-stored objects decoded (whole, as a 200)
        wanted = range_header(start, length)
        if wanted:
            headers["Range"] = wanted
        params = {}
        if expect is not None and len(expect.tag) == 2 and expect.tag[0] == "generation":
            params["ifGenerationMatch"] = expect.tag[1]
        session = await self.fs._set_session()
        request = session.get(self.fs.url(path), params=self.fs._get_params(params),
                              headers=self.fs._get_headers(headers), auto_decompress=False)
        async with _on_asyncio(request) as r:
            return await http_answer(key, f"gs://{path}", r, start, length, gcs_version)

    # -- other backends

    def _generic_get(self, path: str, start: int, length: int | None):
        version = generic_version(self.fs.info(path))
        end = None if (length is None or start < 0) else start + length
        return self.fs.cat_file(path, start=start, end=end), version

    async def _generic_get_async(self, path: str, start: int, length: int | None):
        version = generic_version(await self.fs._info(path))
        end = None if (length is None or start < 0) else start + length
        return await self.fs._cat_file(path, start=start, end=end), version


async def http_answer(key: str, url: str, r, start: int, length: int | None,
                      version_of: Callable[..., Version]) -> tuple[bytes | None, Version | None]:
    """What an HTTP(S) or GCS answer to a GET of (start, length) holds: (bytes, version), or
    (None, None) when absent; a changed object is ShardChanged, an answer that does not fit
    the request BadAnswer. `version_of(headers, size)` reads the version from the headers."""
    if r.status in (404, 410):
        return None, None
    if r.status == 412:
        raise ShardChanged(key, "changed while mounted (412 on a precondition)")
    if r.status == 416:  # the range starts past the end: nothing there, the size is known
        m = re.search(r"/(\d+)", r.headers.get("Content-Range", ""))
        return b"", (version_of(r.headers, int(m.group(1))) if m else None)
    if r.status not in (200, 206):
        raise HttpStatus(r.status, url)
    announced = r.headers.get("Content-Length")
    try:
        announced = None if announced is None else int(announced)
    except ValueError:
        raise BadAnswer(f"{url}: unusable Content-Length ({announced[:40]!r})") from None
    data, size = await answer_body(url, r.status == 206, r.headers.get("Content-Range"), announced,
                                   r.headers.get("Content-Encoding"), r.content.read, start, length)
    return data, version_of(r.headers, size)


def check_version(key: str, expect: Version, version: Version | None, data: bytes | None) -> None:
    """Bytes read while expecting `expect` came from `version`: anything else is ShardChanged."""
    if data is None:
        raise ShardChanged(key, "deleted while mounted")
    if not expect.same(version):
        raise ShardChanged(key)


def s3_version(resp: dict, size: int) -> Version:
    modified = resp.get("LastModified")
    etag = resp.get("ETag")
    tag = ("etag", etag) if etag else (("last-modified", str(modified)) if modified else ())
    return Version(size, tag, datetime_ns(modified) if modified is not None else None)


#: fields of fsspec `info` dicts that change when an object is rewritten (gcs, memory, ...)
GENERIC_TAGS = ("generation", "etag", "ETag", "md5Hash", "LastModified", "last_modified", "updated", "mtime", "created")


def generic_version(info: dict) -> Version:
    tag = tuple((k, str(info[k])) for k in GENERIC_TAGS if info.get(k) is not None)
    return Version(int(info.get("size") or 0), tag)


async def _on_loop(loop, coro: Callable[[], object]):
    """Await a coroutine on another thread's asyncio loop from trio, without a worker thread:
    the future's done-callback wakes this task. Cancelling the trio task cancels the coroutine;
    whatever an abandoned coroutine ends with is dropped there (asyncio would otherwise log
    "Task exception was never retrieved" with a traceback for every attempt cut off by the
    deadline while the backend's own timeout fired)."""
    abandoned = False

    async def run():
        try:
            return await coro()
        except BaseException:
            if abandoned:
                return None
            raise

    future = asyncio.run_coroutine_threadsafe(run(), loop)
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    future.add_done_callback(lambda _: token.run_sync_soon(done.set))
    try:
        await done.wait()
    except trio.Cancelled:
        abandoned = True
        future.cancel()
        raise
    return future.result()


async def answer_body(url: str, partial: bool, content_range: str | None, announced: int | None,
                      encoding: str | None, read: Callable[[int], Awaitable[bytes]], start: int,
                      length: int | None) -> tuple[bytes, int]:
    """The bytes of `(start, length)` out of an answer, and the object's size, reading the body in
    pieces with what was asked for as a hard limit: nothing a server sends can hold more of the
    daemon's memory than the bytes asked for (BadAnswer first).

    * a 206: at most the bytes asked for (a longer body, announced or not, is BadAnswer after
      one byte too many; an announced one before any);
    * a 200 to a range request (the server ignores Range, so the body is the whole object):
      refused at once unless its Content-Length says the object's size and that is at most
      `WHOLE_BODY_LIMIT`; then the bytes before the range are read and dropped as they come,
      the range is kept, and nothing after it is read (the connection is closed, not reused).
      A suffix range needs the body up to its end, the rest only what is asked for. (Issue 22:
      an endless 200 to `bytes=-256` was buffered up to 64 MiB per read, 16 readers took the
      daemon to 1.6-1.9 GiB under memory=64M, and the freed buffers stayed resident.)
    * a 200 to a request without Range (the whole object was asked for): at most
      `WHOLE_BODY_LIMIT` bytes.

    An encoded answer (`Content-Encoding` other than identity) is BadAnswer before any byte is
    read: its bytes are not the stored ones, and its ranges are of the encoded form (a gzip
    bomb decoded behind zvfs's back reached 1,859 MiB; HTTP and GCS responses are read with
    aiohttp's `auto_decompress=False`, as aiobotocore reads S3's)."""
    if encoding and encoding.strip().lower() != "identity":
        raise BadAnswer(f"{url}: the answer is encoded (Content-Encoding: {encoding[:40]}), not the stored bytes")
    wanted = range_header(start, length)
    if partial:
        limit = -start if start < 0 else (WHOLE_BODY_LIMIT if length is None else length)
        body = await _read_at_most(read, limit, announced, f"{url}: more than the {limit} bytes asked for ({wanted}) in the answer")
        data, size = slice_answer(url, True, content_range, body, start, length)
        return data, len(body) if size is None else size
    if not wanted:
        body = await _read_at_most(read, WHOLE_BODY_LIMIT, announced, f"{url}: the whole object is more than {WHOLE_BODY_LIMIT} bytes")
        data, size = slice_answer(url, False, None, body, start, length, announced)
        return data, len(body) if size is None else size
    if announced is None:
        raise BadAnswer(f"{url}: the server ignores Range requests ({wanted}) and does not say how long the object is")
    if announced > WHOLE_BODY_LIMIT:
        raise BadAnswer(f"{url}: the server ignores Range requests and sends the whole object, more than "
                        f"{WHOLE_BODY_LIMIT} bytes ({announced} announced), for {wanted}")
    first = max(0, announced + start) if start < 0 else min(start, announced)
    end = announced if start < 0 or length is None else min(announced, start + length)
    await _read_exactly(read, first, url, announced, keep=False)
    return await _read_exactly(read, end - first, url, announced), announced


#: one in this many request slots is left to reads, whatever the listings under way (`list`)
READ_SHARE = 4
#: the largest piece asked of a body at a time (bytes before a range are dropped piece by piece)
PIECE = 1 << 20
#: an href that names a file or directory below its page as it is, as index pages link (no
#: scheme, host, query, fragment, `.` or `..` segment, nor a leading `/`): no URL join needed
PLAIN_HREF = re.compile(r"(?![./])(?:(?!/\.)[^:?#])*\Z")
#: characters of an index page scanned again with the next piece: a link longer than this
#: (its `<a ... href="...` up to the URL's end) that a piece's end cuts is not found
LINK_MAX = 16 << 10
#: links of an index page parsed between turns of the loop, whose other requests wait
#: meanwhile (~5 ms; a piece's 22,000 links parsed at once held reads of other files 0.2-0.3 s)
LINKS_AT_ONCE = 512


async def _read_at_most(read: Callable[[int], Awaitable[bytes]], limit: int, announced: int | None, too_long: str) -> bytes:
    """The whole body, which must be at most `limit` bytes: BadAnswer after `limit` + 1 bytes,
    or before any when a longer one is announced. (Issue 22: a 206 whose body never ended grew
    the daemon to 2,367 MiB under memory=64M before the request timeout.)"""
    if announced is not None and announced > limit:
        raise BadAnswer(f"{too_long} ({announced} announced)")
    parts, got = [], 0
    while got <= limit and (part := await read(min(PIECE, limit + 1 - got))):
        parts.append(part)
        got += len(part)
    if got > limit:
        raise BadAnswer(too_long)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def _read_exactly(read: Callable[[int], Awaitable[bytes]], n: int, url: str, announced: int,
                        keep: bool = True) -> bytes:
    """The next `n` bytes of a body of `announced` bytes (dropped as they come unless `keep`);
    a body that ends before is cut short (BadAnswer)."""
    parts, got = [], 0
    while got < n:
        part = await read(min(PIECE, n - got))
        if not part:
            raise BadAnswer(f"{url}: the answer ends before its announced {announced} bytes")
        got += len(part)
        if keep:
            parts.append(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class _on_asyncio:
    """`async with` over a response coroutine that releases the response at the end."""

    def __init__(self, opening):
        self.opening = opening
        self.response = None

    async def __aenter__(self):
        self.response = await self.opening
        return self.response

    async def __aexit__(self, *exc):
        self.response.release()


def _redact_url(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}{parts.path}"


def _scrub(text: str) -> str:
    """A backend's message without what may carry credentials: query strings and userinfo."""
    return re.sub(r"//[^/@\s]*@", "//", re.sub(r"\?[^\s'\"]*", "", text))


def _protocols(fs) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def _describe(e: BaseException) -> str:
    status = _status(e)
    return f"HTTP {status}" if status is not None else type(e).__name__


def _storage_error(display: str, key: str, e: Exception) -> StorageError:
    """One line naming the key and what the backend said (HTTP status, connection error...)."""
    status = _status(e)
    what = f"HTTP {status}" if status is not None else type(e).__name__
    detail = _scrub(str(e).splitlines()[0]) if str(e) else ""
    said = f": {detail}" if detail and detail != what and str(status) not in detail[:4] else ""
    return StorageError(f"{display}/{key}: {what}{said}"[:300])
