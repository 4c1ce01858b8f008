"""zvfs: sharded chunked stores as their unsharded one-file-per-chunk trees, over FUSE."""

from importlib.metadata import version
from pathlib import Path

__version__ = version("zvfs")

#: A small sharded Zarr v3 store shipped with the package (see scripts/make-sample).
SAMPLE_STORE = str(Path(__file__).parent / "sample" / "brain.zarr")
