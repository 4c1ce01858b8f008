"""The names users type for store kinds and views (the registry of what each means is
kinds.py). Apart from it so that option parsing, and with it the mount front end, loads no
format or view code."""

from enum import StrEnum


class StoreKind(StrEnum):
    ZARR3 = "zarr3"
    ZVF = "zvf"
    PRECOMPUTED = "precomputed"


class View(StrEnum):
    ZARR = "zarr"
    ZARR2 = "zarr2"
    N5 = "n5"
    PRECOMPUTED = "precomputed"
