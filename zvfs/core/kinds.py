"""The store kinds zvfs mounts, in one place: how each is recognised and loaded, which views
it has (the first is its default), and which sections `zvfs inspect` shows for it.

Every kind loads into its own metadata (Zarr nodes, a precomputed Dataset) and an array model
(formats/array.py). A kind's own view is built from its own metadata (the unsharded Zarr v3
tree of a Zarr store, the unsharded precomputed tree); every other view it lists is an array
view (views/hierarchy.py: Zarr v3, Zarr v2, N5) of its array model, so adding a kind means one
formats module, one views module if it has a view of its own, and one entry in `KINDS`.

Parts of a store that have no array form (precomputed skeletons, meshes, annotations) are
absent from the array views and listed by `zvfs inspect --view ...`; a store with no array at
all refuses an array view (one line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from ..errors import MetadataError
from ..formats import precomputed, precomputed_array, zarr3, zvf
from ..formats.array import ArrayModel, Hierarchy
from ..formats.jsonfile import parse_json_object
from ..names import StoreKind, View
from ..storage import Entry, Store
from ..storage.cache import CoalescingCache
from ..storage.gather import gather
from ..tree.nodes import Tree
from ..views.hierarchy import HierarchyView
from ..views.n5 import N5View
from ..views.precomputed import PrecomputedView
from ..views.zarr2 import Zarr2View
from ..views.zarr3 import ModelZarr3View, Zarr3View
from ..views.zvf import ZvfObjects


@dataclass
class Opened:
    """What a kind's loader and views work with."""

    store: Store
    cache: CoalescingCache  # shard indexes
    listings: CoalescingCache  # store listings
    decoded: CoalescingCache  # decoded chunks, N5 blocks, ZVF objects
    n5_compression: str = "raw"
    #: the store directories the views show as directories of their own (groups, arrays, their
    #: chunk directories, precomputed scales), as the store lists them: their owner and bits
    dirs: dict[str, Entry] = field(default_factory=dict)
    max_metadata: int | None = None  # metadata held, each file and in all, as parsed (None: the default)


@dataclass
class Loaded:
    meta: Any  # the kind's own metadata: Zarr nodes by path, a precomputed Dataset
    arrays: Hierarchy  # its array model
    absent: dict[str, str] = field(default_factory=dict)  # parts with no array form -> why


@dataclass
class Shown:
    tree: Tree
    absent: dict[str, str]  # paths the view leaves out -> why


Probe = Callable[[str], Awaitable[bytes | None]]  # a root key's bytes (read once per open)


async def dress(o: Opened, loaded: Loaded) -> None:
    """Learn the owner and bits of every store directory a view shows as a directory of its
    own (`Opened.dirs`): nothing is shown wider than the store (storage/access.py)."""
    paths = {""}
    for path, node in loaded.arrays.items():
        paths.add(path)
        if isinstance(node, ArrayModel) and node.chunk_dir:
            paths.add(f"{path}/{node.chunk_dir}" if path else node.chunk_dir)
    if isinstance(loaded.meta, precomputed.Dataset):
        paths.update(loaded.meta.sharded)
    paths = sorted(paths)
    found = await gather(lambda p=p: o.store.info(p) for p in paths)
    o.dirs = {p: e for p, e in zip(paths, found) if e is not None and e.is_dir}
OwnView = Callable[[Opened, Loaded], Shown]


@dataclass(frozen=True)
class Kind:
    name: StoreKind
    detect: Callable[[Probe], Awaitable[bool]]
    load: Callable[[Opened], Awaitable[Loaded]]
    views: tuple[View, ...]  # the first is the default
    own_views: dict[View, OwnView]  # views built by the kind itself; the others show `Loaded.arrays`
    sections: tuple[str, ...]  # what `zvfs inspect` reports (report.SECTIONS)

    @property
    def default_view(self) -> View:
        return self.views[0]


# --------------------------------------------------------------------------- Zarr v3 and ZVF


async def _zarr_root_attributes(probe: Probe) -> dict | None:
    raw = await probe(zarr3.META)
    if raw is None:
        return None
    try:
        attrs = parse_json_object(raw, zarr3.META).get("attributes")
    except MetadataError:
        return {}  # not ours to judge here: the loader names the problem
    return attrs if isinstance(attrs, dict) else {}


async def _is_zvf(probe: Probe) -> bool:
    attrs = await _zarr_root_attributes(probe)
    return attrs is not None and zvf.is_zvf_root(attrs)


async def _is_zarr3(probe: Probe) -> bool:
    return await probe(zarr3.META) is not None


async def _load_zarr(o: Opened) -> Loaded:
    nodes = await zarr3.load_hierarchy(o.store, o.max_metadata)
    return Loaded(nodes, zarr3.hierarchy_model(nodes, o.store, o.cache))


def _zarr_view(o: Opened, loaded: Loaded) -> Shown:
    return Shown(Zarr3View(o.store, loaded.meta, o.cache, o.listings, loaded.arrays, o.dirs).tree, {})


def _zvf_view(o: Opened, loaded: Loaded) -> Shown:
    view = Zarr3View(o.store, loaded.meta, o.cache, o.listings, loaded.arrays, o.dirs)
    ZvfObjects(view, loaded.arrays, o.decoded)
    return Shown(view.tree, {})


# --------------------------------------------------------------------------- precomputed


async def _is_precomputed(probe: Probe) -> bool:
    return await probe(precomputed.INFO) is not None


async def _load_precomputed(o: Opened) -> Loaded:
    dataset = await precomputed.load_dataset(o.store, o.max_metadata)
    arrays = precomputed_array.volume_hierarchy(o.store, dataset, o.cache, o.decoded)
    return Loaded(dataset, arrays, precomputed_array.no_array_form(dataset))


def _precomputed_view(o: Opened, loaded: Loaded) -> Shown:
    return Shown(PrecomputedView(o.store, loaded.meta, o.cache, o.decoded, o.listings, o.dirs).tree, {})


# --------------------------------------------------------------------------- the registry

KINDS: dict[StoreKind, Kind] = {k.name: k for k in (
    # detection runs in this order: a ZVF store is a Zarr v3 store too
    Kind(StoreKind.ZVF, _is_zvf, _load_zarr, (View.ZARR, View.ZARR2, View.N5), {View.ZARR: _zvf_view}, ("arrays", "zvf")),
    Kind(StoreKind.ZARR3, _is_zarr3, _load_zarr, (View.ZARR, View.ZARR2, View.N5), {View.ZARR: _zarr_view}, ("arrays",)),
    Kind(StoreKind.PRECOMPUTED, _is_precomputed, _load_precomputed, (View.PRECOMPUTED, View.ZARR, View.ZARR2, View.N5),
         {View.PRECOMPUTED: _precomputed_view}, ("precomputed",)),
)}
#: what the error says when nothing matches
RECOGNISED = "no zarr.json or precomputed info at its root"


async def detect(probe: Probe) -> Kind | None:
    for kind in KINDS.values():
        if await kind.detect(probe):
            return kind
    return None


ARRAY_VIEWS: dict[View, type[HierarchyView]] = {View.ZARR: ModelZarr3View, View.ZARR2: Zarr2View, View.N5: N5View}


def show(kind: Kind, view: View, o: Opened, loaded: Loaded, where: str) -> Shown:
    """The tree of `view` over a loaded store of `kind`."""
    own = kind.own_views.get(view)
    if own is not None:
        return own(o, loaded)
    if not any(isinstance(n, ArrayModel) for n in loaded.arrays.values()):
        why = loaded.absent.get("", "it holds no arrays")
        raise MetadataError(f"{where} (--view {view})", f"nothing to show: {why} (available: {kind.default_view})")
    cls = ARRAY_VIEWS[view]
    extra = {"compression": o.n5_compression} if cls is N5View else {}
    shown = cls(o.store, loaded.arrays, o.decoded, o.listings, dirs=o.dirs, **extra)
    return Shown(shown.tree, {**loaded.absent, **shown.absent})
