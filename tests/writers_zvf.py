"""ZVF fixture stores written by zarr-vectors (the independent writer).

Every case is written twice by ``write_case``: sharded (``shard_shape=...``) and unsharded
(the twin), with the same seeded data, under the same store basename in two different parent
directories (the root group's attributes carry ``"name": <basename>``). The unsharded twin is
the expected result of mounting the sharded store with zvfs.

Each case function takes ``(path, shard)``, where ``shard`` is the shard shape or None, and
is registered with a ``CaseInfo`` telling the tests how to read the store back with zarr-vectors.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

warnings.filterwarnings("ignore", module="zarr")


@dataclass
class CaseInfo:
    geometry: str  # points, lines, polylines, graph, skeleton, mesh
    levels: list[int] = field(default_factory=lambda: [0])
    has_objects: bool = True  # object_index/ at level 0
    #: levels built by ID-preserving sparsification (some manifests empty)
    sparsified_levels: list[int] = field(default_factory=list)
    #: the store has a leading attribute chunk axis (chunk_by_attribute)
    by_attribute: bool = False
    #: the store has a chunk_grid_origin (negative bounds)
    negative: bool = False
    compressed: bool = False
    #: so many objects that listing `objects/` is a test of its own (manifests span 2 chunks)
    many_objects: bool = False
    #: the sharded store was made by zarr-vectors' shard_store (every array sharded, all levels)
    resharded: bool = False


CASES: dict[str, Callable[[Path, object], None]] = {}
INFOS: dict[str, CaseInfo] = {}


def case(info: CaseInfo):
    def register(fn):
        CASES[fn.__name__] = fn
        INFOS[fn.__name__] = info
        return fn

    return register


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# -- geometries ---------------------------------------------------------------------------------
# Chunk grids are 5 per axis (1000 / 200) unless noted; shard (2, 2, 2) leaves partial edge shards.

CHUNK = (200.0, 200.0, 200.0)
BIN = (100.0, 100.0, 100.0)
SHARD = (2, 2, 2)


@case(CaseInfo("points", has_objects=False))
def points_plain(path: Path, shard) -> None:
    from zarr_vectors.types.points import write_points

    pos = _rng(1).uniform(0, 1000, (1500, 3)).astype(np.float32)
    write_points(str(path), pos, chunk_shape=CHUNK, bin_shape=BIN, shard_shape=shard)


@case(CaseInfo("points"))
def points_oids(path: Path, shard) -> None:
    from zarr_vectors.types.points import write_points

    rng = _rng(2)
    pos = rng.uniform(0, 1000, (1500, 3)).astype(np.float32)
    oids = rng.integers(0, 40, 1500)
    write_points(str(path), pos, chunk_shape=CHUNK, bin_shape=BIN, object_ids=oids,
                 vertex_attributes={"intensity": rng.uniform(0, 1, 1500).astype(np.float32)},
                 object_attributes={"label": np.arange(40, dtype=np.int32) * 3},
                 shard_shape=shard)


@case(CaseInfo("lines"))
def lines(path: Path, shard) -> None:
    from zarr_vectors.types.lines import write_lines

    rng = _rng(3)
    a = rng.uniform(0, 1000, (120, 3))
    b = np.clip(a + rng.normal(0, 150, (120, 3)), 0, 999)
    write_lines(str(path), np.stack([a, b], axis=1).astype(np.float32), chunk_shape=CHUNK, shard_shape=shard)


def _walks(rng, n, steps, scale=60.0, lo=0.0, hi=999.0):
    out = []
    for _ in range(n):
        start = rng.uniform(lo + 100, hi - 100, 3)
        walk = start + np.cumsum(rng.normal(0, scale, (int(rng.integers(steps // 2, steps)), 3)), axis=0)
        out.append(np.clip(walk, lo, hi).astype(np.float32))
    return out


@case(CaseInfo("polylines"))
def polylines(path: Path, shard) -> None:
    from zarr_vectors.types.polylines import write_polylines

    write_polylines(str(path), _walks(_rng(4), 40, 30), chunk_shape=CHUNK, bin_shape=BIN, shard_shape=shard)


def _graph(rng, n_obj=6, per=25):
    pos, edges, oids = [], [], []
    base = 0
    for o in range(n_obj):
        p = np.clip(rng.uniform(100, 900, 3) + np.cumsum(rng.normal(0, 70, (per, 3)), axis=0), 0, 999)
        pos.append(p)
        # a tree: every node's parent is an earlier node of the same object
        for i in range(1, per):
            edges.append((base + i, base + int(rng.integers(0, i))))
        oids += [o] * per
        base += per
    return np.concatenate(pos).astype(np.float32), np.array(edges, dtype=np.int64), np.array(oids, dtype=np.int64)


@case(CaseInfo("graph"))
def graph(path: Path, shard) -> None:
    from zarr_vectors.types.graphs import write_graph

    pos, edges, oids = _graph(_rng(5))
    write_graph(str(path), pos, edges, chunk_shape=CHUNK, kind="graph", object_ids=oids, shard_shape=shard)


@case(CaseInfo("skeleton"))
def skeleton(path: Path, shard) -> None:
    from zarr_vectors.types.graphs import write_graph

    pos, edges, oids = _graph(_rng(6))
    write_graph(str(path), pos, edges, chunk_shape=CHUNK, kind="skeleton", object_ids=oids, shard_shape=shard)


@case(CaseInfo("mesh"))
def mesh(path: Path, shard) -> None:
    from zarr_vectors.types.meshes import write_mesh

    # two objects, each a grid surface of triangles spanning several chunks
    rng = _rng(7)
    verts, faces, oids = [], [], []
    base = 0
    for o, z in enumerate((250.0, 700.0)):
        n = 12
        xs, ys = np.meshgrid(np.linspace(50, 950, n), np.linspace(50, 950, n), indexing="ij")
        v = np.stack([xs.ravel(), ys.ravel(), z + rng.normal(0, 20, n * n)], axis=1)
        verts.append(v)
        for i in range(n - 1):
            for j in range(n - 1):
                a, b, c, d = i * n + j, (i + 1) * n + j, i * n + j + 1, (i + 1) * n + j + 1
                faces += [(base + a, base + b, base + c), (base + b, base + d, base + c)]
        oids += [o] * (n * n)
        base += n * n
    write_mesh(str(path), np.concatenate(verts).astype(np.float32), np.array(faces, dtype=np.int64),
               chunk_shape=CHUNK, object_ids=np.array(oids, dtype=np.int64), shard_shape=shard)


@case(CaseInfo("polylines", compressed=True))
def zstd_polylines(path: Path, shard) -> None:
    from zarr_vectors.types.polylines import write_polylines

    write_polylines(str(path), _walks(_rng(8), 30, 30), chunk_shape=CHUNK, bin_shape=BIN, compressor="zstd",
                    shard_shape=shard)


@case(CaseInfo("points", compressed=True))
def zstd_points(path: Path, shard) -> None:
    from zarr_vectors.types.points import write_points

    rng = _rng(9)
    pos = rng.uniform(0, 1000, (1200, 3)).astype(np.float32)
    write_points(str(path), pos, chunk_shape=CHUNK, bin_shape=BIN, object_ids=rng.integers(0, 25, 1200),
                 compressor="zstd", shard_shape=shard)


@case(CaseInfo("polylines", negative=True))
def negative(path: Path, shard) -> None:
    from zarr_vectors.types.polylines import write_polylines

    # coordinates in [-1000, 600): chunk coordinates -5..2, a chunk_grid_origin of -5
    write_polylines(str(path), _walks(_rng(10), 30, 30, lo=-1000.0, hi=599.0), chunk_shape=CHUNK, bin_shape=BIN,
                    shard_shape=shard)


@case(CaseInfo("points", by_attribute=True))
def by_attribute(path: Path, shard) -> None:
    from zarr_vectors.types.points import write_points

    rng = _rng(11)
    pos = rng.uniform(0, 1000, (1200, 3)).astype(np.float32)
    gene = rng.integers(0, 3, 1200).astype(np.int32)
    write_points(str(path), pos, chunk_shape=CHUNK, bin_shape=BIN,
                 vertex_attributes={"gene": gene, "w": rng.uniform(0, 1, 1200).astype(np.float32)},
                 object_ids=rng.integers(0, 30, 1200), chunk_by_attribute="gene",
                 shard_shape=None if shard is None else (1, *shard))


@case(CaseInfo("polylines", levels=[0, 1, 2], sparsified_levels=[2]))
def pyramid(path: Path, shard) -> None:
    """Streamlines, level 0 sharded; level 1 coarsened, level 2 coarsened and sparsified with
    ID-preserving sparsification (dropped ids keep empty manifests); coarse levels unsharded."""
    from zarr_vectors.multiresolution.coarsen import build_pyramid
    from zarr_vectors.types.polylines import write_polylines

    write_polylines(str(path), _walks(_rng(12), 40, 40), chunk_shape=CHUNK, bin_shape=(50.0, 50.0, 50.0),
                    shard_shape=shard)
    build_pyramid(str(path), factors=[(2.0, 1.0), (2.0, 3.0)], sparsity_seed=7)


@case(CaseInfo("points", levels=[0, 1], sparsified_levels=[1]))
def points_pyramid(path: Path, shard) -> None:
    from zarr_vectors.multiresolution.coarsen import build_pyramid
    from zarr_vectors.types.points import write_points

    rng = _rng(13)
    pos = rng.uniform(0, 1000, (1500, 3)).astype(np.float32)
    write_points(str(path), pos, chunk_shape=CHUNK, bin_shape=(50.0, 50.0, 50.0), object_ids=rng.integers(0, 30, 1500),
                 shard_shape=shard)
    build_pyramid(str(path), factors=[(2.0, 2.0)], chunk_scale_factors=[2], sparsity_seed=3)


@case(CaseInfo("polylines", levels=[0, 1, 2], sparsified_levels=[2], resharded=True))
def pyramid_resharded(path: Path, shard) -> None:
    """The unsharded pyramid, then (for the sharded store) zarr_vectors.sharding.shard_store with a
    shard of 3 chunks per axis: every array of every level sharded, partial edge shards (grid 5).
    shard_store rewrites level group attributes itself; the twin is the store before it."""
    from zarr_vectors.sharding import shard_store

    pyramid(path, None)
    if shard is not None:
        shard_store(str(path), shard_shape=3)


@case(CaseInfo("points"))
def sparse_ids(path: Path, shard) -> None:
    """Points whose object ids are not 0..N-1 (an object_ids table maps manifest rows to ids)."""
    from zarr_vectors.types.points import write_points

    rng = _rng(14)
    pos = rng.uniform(0, 1000, (1000, 3)).astype(np.float32)
    ids = np.array([3, 10, 99, 1000, 5])[rng.integers(0, 5, 1000)]
    write_points(str(path), pos, chunk_shape=CHUNK, object_ids=ids, shard_shape=shard)


@case(CaseInfo("polylines"))
def two_d(path: Path, shard) -> None:
    from zarr_vectors.types.polylines import write_polylines

    rng = _rng(15)
    walks = [np.clip(rng.uniform(100, 900, 2) + np.cumsum(rng.normal(0, 60, (25, 2)), axis=0), 0, 999).astype(np.float32)
             for _ in range(20)]
    write_polylines(str(path), walks, chunk_shape=(200.0, 200.0), shard_shape=None if shard is None else (2, 2))


@case(CaseInfo("points"))
def float64_points(path: Path, shard) -> None:
    from zarr_vectors.types.points import write_points

    rng = _rng(16)
    pos = rng.uniform(0, 1000, (1000, 3))
    write_points(str(path), pos, chunk_shape=CHUNK, object_ids=rng.integers(0, 12, 1000), dtype="float64",
                 shard_shape=shard)


@case(CaseInfo("polylines"))
def long_streamline(path: Path, shard) -> None:
    """One streamline of 30000 vertices (its objects/ file is > 128 KiB, several FUSE reads) and
    a few short ones."""
    from zarr_vectors.types.polylines import write_polylines

    rng = _rng(17)
    long = np.clip(500 + np.cumsum(rng.normal(0, 5, (30000, 3)), axis=0), 0, 999).astype(np.float32)
    write_polylines(str(path), [long, *_walks(rng, 5, 20)], chunk_shape=CHUNK, shard_shape=shard)


@case(CaseInfo("polylines", compressed=True))
def blosc_polylines(path: Path, shard) -> None:
    from zarr_vectors.types.polylines import write_polylines

    write_polylines(str(path), _walks(_rng(18), 15, 25), chunk_shape=CHUNK, compressor="blosc", shard_shape=shard)


@case(CaseInfo("points", by_attribute=True, negative=True))
def negative_by_attribute(path: Path, shard) -> None:
    from zarr_vectors.types.points import write_points

    rng = _rng(19)
    pos = rng.uniform(-500, 500, (1000, 3)).astype(np.float32)
    write_points(str(path), pos, chunk_shape=CHUNK, vertex_attributes={"gene": rng.integers(0, 3, 1000).astype(np.int32)},
                 object_ids=rng.integers(0, 10, 1000), chunk_by_attribute="gene",
                 shard_shape=None if shard is None else (1, *shard))


@case(CaseInfo("points", many_objects=True))
def many_objects(path: Path, shard) -> None:
    """17000 single-point objects: object_index/manifests spans two chunks (16384 per chunk)."""
    from zarr_vectors.types.points import write_points

    pos = _rng(20).uniform(0, 1000, (17000, 3)).astype(np.float32)
    write_points(str(path), pos, chunk_shape=CHUNK, object_ids=np.arange(17000), shard_shape=shard)




def write_case(name: str, parent: Path, sharded: bool = True) -> tuple[Path, CaseInfo]:
    """Write case NAME to PARENT/<name>.zv (sharded with SHARD, or the unsharded twin)."""
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / f"{name}.zv"
    CASES[name](path, SHARD if sharded else None)
    return path, INFOS[name]
