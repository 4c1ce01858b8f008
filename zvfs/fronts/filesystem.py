"""The fsspec front: a source's view as an fsspec filesystem, protocol `zvfs`, in-process, no
FUSE (Dask workers, xarray, zarr-python, containers without /dev/fuse).

    fs = fsspec.filesystem("zvfs", fo="s3://bucket/brain.zarr", view="zarr2", memory="1G")
    zarr.open_group(fs.get_mapper(""))                  # zarr-python 2.18
    xarray.open_zarr("zvfs::s3://bucket/brain.zarr", storage_options={"s3": {"anon": True}})

A chained URL (`zvfs::PROTOCOL://...`) gives the source as the target, with the target's own
fsspec options (`target_options`, or `{"s3": {...}}` in `storage_options`); they are laid over
the ones zvfs picks itself (timeouts, one attempt per request: zvfs retries). Other keywords are
the mount's `-o` options (`view=`, `memory=`, `index_cache=`, `n5_compression=`, ...).

The core runs on a trio loop in a thread of its own (one per filesystem object and process):
every call from any thread is handed to it and waits, so the object is thread-safe and reads
of many threads at once are served together. Pickled, it is rebuilt from its arguments (fsspec
does that), so a Dask worker opens its own copy of the source; a forked child starts a loop of
its own on first use. A file opened (`fs.open`) is a snapshot of one version, as on a mount: its
reads come from that version or raise `OSError(EIO)`, never another version's bytes; `cat_file`
is one such open.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import os
import threading
from typing import Any

import trio
from fsspec.asyn import AsyncFileSystem
from fsspec.spec import AbstractBufferedFile

from ..core.paths import BadPath, OpenFile, Paths, Stat
from ..core.source import open_source
from ..errors import CorruptShardError, Gone, ShardChanged, StorageError, TooManyOpen
from ..options import parse_options


def _read_only() -> OSError:
    return OSError(errno.EROFS, "zvfs is read-only")


def _as_os_error(e: Exception, path: str) -> Exception:
    """The core's failures as the OSErrors fsspec callers know (missing: FileNotFoundError,
    so mappers give KeyError and zarr the fill value)."""
    if isinstance(e, (Gone, BadPath)):
        return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    if isinstance(e, TooManyOpen):
        return OSError(errno.ENFILE, str(e), path)
    if isinstance(e, (ShardChanged, CorruptShardError, StorageError)):
        return OSError(errno.EIO, str(e), path)
    return e


class _Loop:
    """A trio loop in a daemon thread. `submit(afn, *args)` starts `afn` on it from any other
    thread and returns a concurrent future of its result (awaited from asyncio, or waited for)."""

    def __init__(self) -> None:
        started = threading.Event()
        self.pid = os.getpid()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                started.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

        self._thread = threading.Thread(target=trio.run, args=(main,), name="zvfs-fsspec", daemon=True)
        self._thread.start()
        started.wait()

    def submit(self, afn, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()

        async def task() -> None:
            try:
                result = await afn(*args)
            except BaseException as e:  # noqa: BLE001 - (handed to the caller)
                future.set_exception(e)
            else:
                future.set_result(result)

        self._token.run_sync_soon(self._nursery.start_soon, task)  # type: ignore[union-attr]
        return future

    def run(self, afn, *args):
        return self.submit(afn, *args).result()

    def stop(self) -> None:
        if self._thread.is_alive():
            try:
                self._token.run_sync_soon(self._stop.set)  # type: ignore[union-attr]
            except trio.RunFinishedError:
                pass


#: the sources opened in this process, by (source, options, target options): every object of the
#: same arguments shares one loop, one store and its caches (fsspec makes one object per thread
#: for a synchronous filesystem; these would otherwise each hold caches of their own)
_OPENED: dict[tuple, tuple[_Loop, Paths]] = {}
_OPENING = threading.Lock()


def _opened(url: str, opts, target_options: dict) -> tuple[_Loop, Paths]:
    key = (os.getpid(), url, repr(opts), repr(sorted(target_options.items())))
    with _OPENING:
        found = _OPENED.get(key)
        if found is None:
            loop = _Loop()
            try:
                source = loop.run(open_source, url, opts, target_options)
            except BaseException:
                loop.stop()
                raise
            found = _OPENED[key] = (loop, Paths(source))
        return found


def _options(options: dict) -> list[str]:
    """Keywords as `-o` items (`True`: a flag)."""
    out = []
    for name, value in options.items():
        if value is True:
            out.append(name)
        elif value is not False and value is not None:
            out.append(f"{name}={value}")
    return out


class ZvfsFileSystem(AsyncFileSystem):
    """A source's view. `fo`: the source (a path or URL; what a chained URL's target gives);
    `view`: as `--view`; `target_protocol`, `target_options`: a chained URL's target and its
    fsspec options; any other keyword: a `-o` option.

    Asynchronous (zarr-python 3's FsspecStore awaits `_cat_file` on its own loop) and
    synchronous (zarr-python 2.18, Dask): the synchronous calls that read one thing (`ls`,
    `info`, `cat_file`) go to the core directly, without fsspec's own loop in between; the
    others (`cat` of many paths) gather the asynchronous ones there."""

    protocol = "zvfs"
    root_marker = ""
    async_impl = True
    cachable = True

    def __init__(self, fo: str = "", view: str | None = None, target_protocol: str | None = None,
                 target_options: dict | None = None, **options: Any):
        fsspec_args = {k: options.pop(k) for k in FSSPEC_ARGS if k in options}
        super().__init__(fo=fo, view=view, target_protocol=target_protocol, target_options=target_options,
                         **options, **fsspec_args)
        if target_protocol and target_protocol != "file" and "://" not in fo:
            fo = f"{target_protocol}://{fo}"
        if not fo:
            raise ValueError("zvfs: no source (fo=PATH_OR_URL, or a chained URL: zvfs::s3://bucket/store)")
        self.source_url = fo
        self.opts = parse_options([",".join(_options(options))])
        if view:
            self.opts.view = view
        self.target_options = dict(target_options or {})
        self._opened = _opened(fo, self.opts, self.target_options)  # now: a source that does not open fails here

    def _core(self) -> tuple[_Loop, Paths]:
        if self._opened[0].pid != os.getpid():  # (a forked child: a loop and a source of its own)
            self._opened = _opened(self.source_url, self.opts, self.target_options)
        return self._opened

    def _run(self, afn, *args):
        """`afn(paths, *args)` on the core's loop, waited for."""
        loop, paths = self._core()
        try:
            return loop.run(afn, paths, *args)
        except Exception as e:
            raise _as_os_error(e, _path_of(args)) from None

    async def _await(self, afn, *args):
        """`afn(paths, *args)` on the core's loop, awaited from an asyncio loop."""
        loop, paths = self._core()
        try:
            return await asyncio.wrap_future(loop.submit(afn, paths, *args))
        except Exception as e:
            raise _as_os_error(e, _path_of(args)) from None

    # -- reading

    @staticmethod
    def _entry(path: str, st: Stat) -> dict:
        return {"name": path, "size": st.size, "type": "directory" if st.is_dir else "file", "mode": st.st_mode,
                "mtime": st.mtime_ns / 1e9, "uid": st.uid, "gid": st.gid, **({"ETag": st.etag} if st.etag else {})}

    def _listed(self, path: str, found: tuple[list[Stat], bool], detail: bool) -> list:
        stats, is_dir = found
        if not is_dir:
            out = [self._entry(path, stats[0])]
        else:
            prefix = f"{path}/" if path else ""
            out = [self._entry(prefix + st.name, st) for st in stats]
        return out if detail else [e["name"] for e in out]

    def ls(self, path: str, detail: bool = True, **kwargs):
        path = self._strip_protocol(path)
        return self._listed(path, self._run(_listing, path), detail)

    async def _ls(self, path: str, detail: bool = True, **kwargs):
        path = self._strip_protocol(path)
        return self._listed(path, await self._await(_listing, path), detail)

    def info(self, path: str, **kwargs) -> dict:
        path = self._strip_protocol(path)
        return self._entry(path, self._run(Paths.stat, path))

    async def _info(self, path: str, **kwargs) -> dict:
        path = self._strip_protocol(path)
        return self._entry(path, await self._await(Paths.stat, path))

    def ukey(self, path: str) -> str:
        return self.info(path).get("ETag") or super().ukey(path)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs) -> bytes:
        return self._run(_read, self._strip_protocol(path), start, end)

    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs) -> bytes:
        return await self._await(_read, self._strip_protocol(path), start, end)

    def _open(self, path: str, mode: str = "rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise _read_only()
        path = self._strip_protocol(path)
        opened = self._run(Paths.open, path)
        return ZvfsFile(self, path, opened, block_size=block_size, cache_options=cache_options, **kwargs)

    # -- writing: refused

    def _refuse(self, *args, **kwargs):
        raise _read_only()

    async def _refuse_async(self, *args, **kwargs):
        raise _read_only()

    mkdir = makedirs = rmdir = rm_file = rm = pipe_file = touch = mv = cp_file = put_file = _refuse
    _mkdir = _makedirs = _rm_file = _rm = _pipe_file = _cp_file = _put_file = _refuse_async


#: keywords fsspec itself takes (not `-o` options)
FSSPEC_ARGS = ("use_listings_cache", "listings_expiry_time", "max_paths", "asynchronous", "loop", "batch_size")


def _path_of(args: tuple) -> str:
    return args[0] if args and isinstance(args[0], str) else ""


async def _listing(paths: Paths, path: str) -> tuple[list[Stat], bool]:
    node = await paths.resolve(path)
    if not node.is_dir:
        return [await paths.stat(path)], False
    return await paths.listdir(path), True


async def _read(paths: Paths, path: str, start: int | None, end: int | None) -> bytes:
    """Bytes [start, end) of one open (negative: from the end), as fsspec's `cat_file`."""
    async with await paths.open(path) as opened:
        size = opened.size
        lo = 0 if start is None else start if start >= 0 else max(0, size + start)
        hi = size if end is None else min(size, end) if end >= 0 else max(0, size + end)
        return await opened.read(lo, hi - lo) if hi > lo else b""


class ZvfsFile(AbstractBufferedFile):
    """An open file: a snapshot of one version (`OpenFile`), released when closed."""

    def __init__(self, fs: ZvfsFileSystem, path: str, opened: OpenFile, block_size=None, cache_options=None,
                 cache_type: str = "readahead", **kwargs):
        self.opened = opened
        super().__init__(fs, path, mode="rb", block_size=block_size, cache_type=cache_type,
                         cache_options=cache_options, size=opened.size, **kwargs)
        self.details = fs._entry(path, opened.stat)

    def _fetch_range(self, start: int, end: int) -> bytes:
        async def read(_paths: Paths, start: int, end: int) -> bytes:
            return await self.opened.read(start, end - start)

        return self.fs._run(read, start, end)

    def close(self) -> None:
        if not self.closed:
            super().close()
            opened, self.opened = self.opened, None
            if opened is not None:
                loop = self.fs._opened[0]
                if loop.pid == os.getpid():  # (a forked child's copy holds nothing of this process)
                    try:
                        loop.run(_release, opened)
                    except Exception:  # noqa: BLE001 - (the loop ended first, at exit)
                        pass


async def _release(opened: OpenFile) -> None:
    opened.close()
