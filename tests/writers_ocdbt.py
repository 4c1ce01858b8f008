"""OCDBT databases written by tensorstore's `ocdbt` kvstore driver, for tests/test_ocdbt.py.

`zarr`: a Zarr v3 group (its zarr.json written through tensorstore's kvstore API) holding a
sharded uint16 array and an unsharded float32 one, zstd-compressed nodes (the default), a
version tree of arity 2 so that older versions sit in version tree nodes, several commits.
`precomputed`: a Neuroglancer precomputed volume (one unsharded and one sharded scale) with
uncompressed nodes of at most 1 KiB, so the B+tree has interior nodes.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

GROUP = b'{"zarr_format": 3, "node_type": "group", "attributes": {"written_by": "tensorstore ocdbt"}}'
CONTEXT = {"cache_pool": {"total_bytes_limit": 0}}


def ocdbt(path: Path, **config) -> dict:
    spec: dict = {"driver": "ocdbt", "base": f"file://{path}/"}
    if config:
        spec["config"] = config
    return spec


def zarr_array(path: Path, name: str, create: dict | None = None):
    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": {**ocdbt(path), "path": f"{name}/"}, "context": CONTEXT}
    return ts.open({**spec, **(create or {})}).result()


def write_zarr(path: Path) -> dict:
    """The `zarr` database; returns what its sharded array held at two generations
    ({"generations": {generation: {array: data}}}), the later one's number ("second") and a
    time between its commit and the next ("between", ns since the epoch)."""
    import tensorstore as ts

    kv = ts.KvStore.open(ocdbt(path, version_tree_arity_log2=1)).result()
    kv.write("zarr.json", GROUP).result()
    sharded = zarr_array(path, "sharded", {"create": True, "metadata": {
        "shape": [64, 48], "data_type": "uint16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [32, 24]}},
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [8, 8], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}]}}]}})
    plain = zarr_array(path, "plain", {"create": True, "metadata": {
        "shape": [40, 30], "data_type": "float32", "fill_value": -1.0,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [16, 16]}},
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip"}]}})
    first = np.arange(64 * 48, dtype="uint16").reshape(64, 48)
    sharded[...] = first
    plain[:20, :] = np.linspace(0, 1, 20 * 30, dtype="float32").reshape(20, 30)
    generations = {_latest(path): {"sharded": first.copy()}}
    second = first.copy()
    second[8:40, 4:20] = 7
    sharded[8:40, 4:20] = 7
    generations[_latest(path)] = {"sharded": second.copy()}
    between = time.time_ns()  # after the second state's commit, before the next
    for k in range(3):  # more commits: the early versions go down into version tree nodes
        sharded[60:64, 40 + k] = 1000 + k
    return {"generations": generations, "second": max(generations), "between": between}


def _latest(path: Path) -> int:
    """The newest generation number, from tensorstore's own reading of the manifest."""
    import tensorstore as ts

    from zvfs.storage.ocdbt_format import decode_manifest

    raw = ts.KvStore.open(f"file://{path}/").result().read("manifest.ocdbt").result().value
    return decode_manifest(bytes(raw), 1 << 24).versions[-1].number


def write_precomputed(path: Path) -> None:
    import tensorstore as ts

    base = ocdbt(path, max_decoded_node_bytes=1024, compression=None)
    info = {"@type": "neuroglancer_multiscale_volume", "type": "segmentation", "data_type": "uint32", "num_channels": 1,
            "scales": [
                {"key": "s0", "size": [40, 36, 20], "resolution": [4, 4, 40], "voxel_offset": [0, 0, 0],
                 "chunk_sizes": [[8, 8, 8]], "encoding": "raw"},
                {"key": "s1", "size": [20, 18, 10], "resolution": [8, 8, 40], "voxel_offset": [0, 0, 0],
                 "chunk_sizes": [[4, 4, 4]], "encoding": "raw",
                 "sharding": {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 1, "hash": "identity",
                              "minishard_bits": 1, "shard_bits": 2, "minishard_index_encoding": "gzip",
                              "data_encoding": "raw"}}]}
    ts.KvStore.open(base).result().write("info", __import__("json").dumps(info).encode()).result()
    rng = np.random.default_rng(5)
    for i, scale in enumerate(info["scales"]):
        t = precomputed_scale(path, i)
        t[...] = rng.integers(0, 50, size=(*scale["size"], 1), dtype="uint32")


def precomputed_scale(path: Path, index: int, kvstore: dict | None = None):
    import tensorstore as ts

    return ts.open({"driver": "neuroglancer_precomputed", "kvstore": kvstore or ocdbt(path), "scale_index": index,
                    "open": True, "context": CONTEXT}).result()


def write_tiny_values(path: Path, tiny: int, large: int, node_bytes: int) -> None:
    """zarr.json, `tiny` keys `a/5/NNNNNN` of 1-byte values between `large` keys `a/0NNN`
    and as many `a/9NNN` of 1000-byte inline values (byte N % 256), in one commit with zstd
    nodes of at most `node_bytes` (tensorstore's measure): leaves of tiny values decode to ~2.1
    times what tensorstore counts for them, leaves of large ones to ~1.05 times. The tiny keys
    are in the middle so that a listing of the root needs only leaves of large values."""
    import tensorstore as ts

    kv = ts.KvStore.open(ocdbt(path, max_decoded_node_bytes=node_bytes, max_inline_value_bytes=1024)).result()
    txn = ts.Transaction()
    t = kv.with_transaction(txn)
    t["zarr.json"] = GROUP
    for i in range(large):
        t[f"a/0{i:03d}"] = t[f"a/9{i:03d}"] = bytes([i % 256]) * 1000
    for i in range(tiny):
        t[f"a/5/{i:06d}"] = b"v"
    txn.commit_async().result()


def write_small_leaves(path: Path) -> np.ndarray:
    """A 64 x 64 uint8 Zarr v3 array of 8 x 8 uncompressed chunks (values 1..254: never the
    fill value) in uncompressed nodes of at most 400 bytes (leaves of a few chunks each)."""
    data = np.random.default_rng(7).integers(1, 255, (64, 64), dtype="uint8")
    kvstore = ocdbt(path, max_decoded_node_bytes=400, compression=None)
    import tensorstore as ts

    t = ts.open({"driver": "zarr3", "kvstore": kvstore, "create": True, "context": CONTEXT, "metadata": {
        "shape": [64, 64], "data_type": "uint8", "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
        "codecs": [{"name": "bytes"}]}}).result()
    t[...] = data
    return data
