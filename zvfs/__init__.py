"""zvfs: sharded chunked stores as their unsharded one-file-per-chunk trees, over FUSE."""

from pathlib import Path


def __getattr__(name: str) -> str:
    """`zvfs.__version__`, looked up when asked for: importlib.metadata costs 35 ms of every
    process start, and only --version, the man page and `zvfs stats` say the version."""
    if name == "__version__":
        from importlib.metadata import version

        return version("zvfs")
    raise AttributeError(f"module 'zvfs' has no attribute {name!r}")

#: A small sharded Zarr v3 store shipped with the package (see scripts/make-sample).
SAMPLE_STORE = str(Path(__file__).parent / "sample" / "brain.zarr")
