"""Open a source: pick the store, recognise the store kind (kinds.py), build the requested view.

This is everything `mount`, `ls`, `cat` and `inspect` share; the FUSE adapter only adds the
kernel on top. `open_source(src)` with default options is a plain library call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from ..errors import MetadataError
from ..formats.array import Hierarchy
from ..formats.jsonfile import read_metadata
from ..options import MountOptions, resolve_caches, storage_options
from ..storage import Entry, Store
from ..storage.base import layer_attribute
from ..storage.cache import CoalescingCache, decoded_size
from ..storage.gather import gather
from ..storage.local import LocalStore
from ..storage.open import open_store, open_zip
from ..tree.nodes import Stamp, Tree
from .kinds import KINDS, RECOGNISED, Kind, Opened, StoreKind, View, detect, dress, show

log = logging.getLogger("zvfs")

#: How often a front that lets other users in looks for directories whose permissions changed
#: in the store (`OpenSource.watch_permissions`): a directory narrowed while mounted is closed
#: to them within about this long. The check runs at most 1/RECHECK_SHARE of the time.
RECHECK, RECHECK_SHARE = 1.0, 20


@dataclass
class OpenSource:
    store: Store
    kind: StoreKind
    view: View
    tree: Tree
    cache: CoalescingCache
    meta: Any = None  # the kind's own metadata (Zarr nodes by path, a precomputed Dataset)
    arrays: Hierarchy | None = None  # the store's array model
    absent: dict | None = None  # what the view leaves out (arrays it cannot express, parts with no array form) -> why
    decoded: CoalescingCache | None = None
    listings: CoalescingCache | None = None
    options: MountOptions = field(default_factory=MountOptions)
    #: the store directories the view shows as directories of their own -> owner, bits, time
    #: (`kinds.dress`; the views hold this very dict)
    dirs: dict[str, Entry] = field(default_factory=dict)

    @property
    def entry(self) -> Kind:
        return KINDS[self.kind]

    @property
    def root(self) -> Stamp:
        """A local store root's bits as a reader sees them, and its owner (an archive's: its
        file's; a store over a local store's: what it says; nothing for remote stores): what
        nodes that have none of their own show."""
        root = self.store.root_mode()
        return Stamp() if root is None else Stamp(root[0], None, root[1], root[2])

    @property
    def local(self) -> bool:
        """A local store: chunk bytes can be at hand without waiting (pushed ahead of opens)."""
        return isinstance(self.store, LocalStore)

    def bound_waits(self) -> None:
        """No request of any front waits for the store longer than the store's patience
        (storage/cache.py): a lookup, a GET or an fsspec read of a file of a shard on a hung
        filesystem is EIO after it, never a hang (`zvfs serve` and the fsspec front hung for
        good: only the FUSE daemon set it).

        For the FUSE front it matters most: the kernel serves the lookups (and listings) of one
        directory one at a time: libfuse before 3.17 never passes FUSE_PARALLEL_DIROPS on to
        the kernel (libfuse commit c9905341, "Pass FUSE_PARALLEL_DIROPS to kernel"; Debian 12
        has 3.14), and since, only when the filesystem asks for it (libfuse #880), which pyfuse3
        does not. A lookup needs its shard's index, so a lookup that waits for a stalled store
        holds every other lookup of its directory behind it, and one on a hung local mount held
        them for good (their readers in D state, even after SIGKILL). Hence the caches' bounded
        waits, and the remote stores' remembered failures and stalls. (Set once the source is
        open: opening reads what decides the tree, which has no other files to serve meanwhile.)"""
        for cache in self.caches().values():
            cache.patience = self.store.patience
            cache.name = self.store.display

    def caches(self) -> dict[str, CoalescingCache]:
        from ..storage.ocdbt import OcdbtStore

        nodes = self.store.nodes if isinstance(self.store, OcdbtStore) else None  # an OCDBT database's B+tree nodes
        named = {"index": self.cache, "decoded": self.decoded, "listings": self.listings, "ocdbt_nodes": nodes}
        return {name: cache for name, cache in named.items() if cache is not None}

    def stats(self) -> dict:
        """Live figures of the store and the caches (`zvfs stats`)."""
        from .. import __version__  # (looked up when asked: see zvfs/__init__.py)

        out = {"zvfs_version": __version__, "source": self.store.display, "view": self.view,
               "backend_requests": 0, "backend_bytes": 0, "retries": 0, "caches": {}}
        layer: Store | None = self.store
        while layer is not None:  # the store and the layers it wraps (read coalescing, disk cache)
            for name, attr in (("backend_requests", "requests"), ("backend_bytes", "bytes"), ("retries", "retries")):
                if hasattr(layer, attr):  # the deepest layer's figure: requests that reached the backend
                    out[name] = getattr(layer, attr) or 0
            block = getattr(layer, "cache_stats", None)
            if block is not None:
                out["caches"][getattr(layer, "cache_name", "block")] = block()
            layer = getattr(layer, "inner", None)
        for name, cache in self.caches().items():
            out["caches"][name] = {"hits": cache.hits, "misses": cache.misses, "bytes": cache.nbytes}
        return out

    async def refresh(self) -> None:
        """`zvfs refresh`, and what a change of directory permissions makes the watch do:
        forget every derived cache; indexes, listings and directory permissions are read
        again, those of the directories the views show at once (`refresh_directories`)."""
        for cache in self.caches().values():
            cache.clear()
        layer: Store | None = self.store
        while layer is not None:  # a disk cache validates every object again
            getattr(layer, "forget_versions", lambda: None)()
            layer = getattr(layer, "inner", None)
        self.tree.forget_listings()
        # (where directories have permissions: local stores, and archives and databases in them;
        # no request per directory elsewhere)
        forget = getattr(self.store, "forget_directories", None)
        if forget is not None:
            forget()
        if isinstance(self.store, LocalStore):
            await self.refresh_directories()

    async def refresh_directories(self) -> None:
        """The owner and bits of the directories the views show, read again (`refresh`);
        within the store's patience (a hung mount below the store keeps what was known)."""
        paths = list(self.dirs)
        found = None
        with trio.move_on_after(self.store.patience):
            found = await gather(lambda p=p: self.store.info(p) for p in paths)
        if found is None:
            log.warning("%s: directory permissions not read again within %g s", self.store.display, self.store.patience)
            return
        for path, entry in zip(paths, found):
            if entry is not None and entry.is_dir:
                self.dirs[path] = entry
            else:  # gone (moved into a closed directory, say): shown closed to all but root,
                # whatever the root's bits (its metadata, read when opened, is no longer the store's)
                old = self.dirs[path]
                self.dirs[path] = Entry(old.name, True, 0, 0, old.mtime_ns, old.uid, old.gid)

    async def watch_permissions(self, changed: Callable[[], None]) -> None:
        """Forever, every RECHECK seconds: whether a directory's owner, group or bits changed
        in the store since they were read (a local store's `directories_changed`); if so,
        everything derived from them is read again (`refresh`) and
        `changed()` is called. The check takes at most 1/RECHECK_SHARE of the time (a store
        whose walks learned 2,421 directories: 9-11 ms a check); what follows a change is not
        counted (150 ms for that store's 621 directories shown: counted, it put the next check
        3 s later, and an outside attacker's change right after a change was seen after 3-5 s)."""
        store = self.store
        if not hasattr(store, "directories_changed"):  # (local stores, and archives and databases in them)
            return
        while True:
            began = time.monotonic()
            try:
                found = await store.directories_changed()
                cost = _look_cost(store, time.monotonic() - began)
                if found:
                    log.info("%s: directory permissions changed; read again", store.display)
                    await self.refresh()
                    changed()
            except Exception as e:  # noqa: BLE001 - a failed check is retried at the next one
                log.warning("%s: cannot check directory permissions: %s", store.display, e)
                cost = time.monotonic() - began
            await trio.sleep(max(RECHECK, cost * RECHECK_SHARE))


def _look_cost(store: Store, waited: float) -> float:
    """What a look for changed permissions cost: the processor time of the local store's
    thread that looked (`LocalStore.look_cost`), not the time waited for it (while the loop
    was busy with a listing of 4,100 shards, looks waited 0.4-0.9 s, the next one came 9-18 s
    later, and a row directory narrowed then stayed open to others that long)."""
    cost = layer_attribute(store, "look_cost")
    return waited if cost is None else cost


async def open_source(source: str, opts: MountOptions | None = None, storage: dict | None = None) -> OpenSource:
    """`storage`: fsspec options for a URL's backend, laid over the ones zvfs picks (the fsspec
    front's target options)."""
    opts = resolve_caches(opts or MountOptions())
    protocol = source.split("://", 1)[0] if "://" in source else "file"
    decoded = CoalescingCache(opts.decoded_cache, decoded_size)  # (archives keep their inflated entries in it too)
    store = open_store(source, max_requests=opts.max_requests, storage_options=storage_options(protocol, opts) | (storage or {}),
                       readahead=opts.readahead, block_cache=opts.block_cache, deadline=opts.retry_deadline,
                       follow_symlinks=opts.follow_symlinks, request_timeout=opts.request_timeout,
                       max_directory=opts.max_metadata, max_listing=opts.memory, inflated=decoded, cache_dir=opts.cache_dir, cache_size=opts.cache_size)
    source = store.display  # from here on, only the redacted form is ever shown
    try:
        # an OCDBT database is a store over the store: probed when nothing else is recognised
        # (no request more for other stores), or first when -o version asks for one of its versions
        kind = None if opts.version else await detect(_probe(store, opts.max_metadata))
        index_share, ocdbt = opts.index_cache // 2, None
        if kind is None and not opts.version and (zipped := await open_zip(store, opts.max_metadata, decoded)) is not None:
            store = zipped  # (a URL of a zip archive not named .zip or .ozx)
            kind = await detect(_probe(store, opts.max_metadata))
        if kind is None:
            from ..storage.ocdbt import open_ocdbt

            ocdbt = await open_ocdbt(store, opts.version, opts.index_cache // 3)
            if ocdbt is not None:
                store, index_share = ocdbt, opts.index_cache // 3  # B+tree nodes take a third of the index share
                kind = await detect(_probe(store, opts.max_metadata))
            elif opts.version:
                raise MetadataError(source, "-o version is for OCDBT databases (no manifest.ocdbt at its root)")
        if kind is None:
            what = "an OCDBT database whose keys are not" if ocdbt else "not"
            raise MetadataError(source, f"{what} a recognised store ({RECOGNISED}{'' if ocdbt else ', nor manifest.ocdbt'})")
        # the index share of the budget is split between shard indexes and store listings
        opened = Opened(store, CoalescingCache(index_share), CoalescingCache(index_share, keep_oversized=True),
                        decoded, opts.n5_compression, max_metadata=opts.max_metadata)
        view = View(opts.view) if opts.view else kind.default_view
        if view not in kind.views:
            raise MetadataError(source, f"view '{view}' is not available for this store (available: {', '.join(kind.views)})")
        loaded = await kind.load(opened)
        await dress(opened, loaded)
        shown = show(kind, view, opened, loaded, source)
        out = OpenSource(store, kind.name, view, shown.tree, opened.cache, loaded.meta, loaded.arrays, shown.absent or None,
                         opened.decoded, opened.listings, opts, opened.dirs)
        out.bound_waits()
        return out
    except BaseException:
        await store.aclose()
        raise


def _probe(store: Store, max_metadata: int):
    """Reads of root keys for detection, each read once (metadata: within `max_metadata`)."""
    seen: dict[str, bytes | None] = {}

    async def probe(key: str) -> bytes | None:
        if key not in seen:
            seen[key] = (await read_metadata(store, key, f"{store.display}/{key}", max_metadata))[0]
        return seen[key]

    return probe
