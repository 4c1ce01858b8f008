"""Run independent async loads concurrently (bounded by the store's own request limit)."""

from __future__ import annotations

from typing import Awaitable, Callable, Iterable, TypeVar

import trio

T = TypeVar("T")


async def gather(calls: Iterable[Callable[[], Awaitable[T]]]) -> list[T]:
    """Results in the order of `calls`. A listing that spans many shards fetches their indexes
    at once instead of one round trip after another."""
    calls = list(calls)
    results: list = [None] * len(calls)

    async def one(i: int, call) -> None:
        results[i] = await call()

    async with trio.open_nursery() as nursery:
        for i, call in enumerate(calls):
            nursery.start_soon(one, i, call)
    return results
