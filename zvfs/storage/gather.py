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

    try:
        async with trio.open_nursery() as nursery:
            for i, call in enumerate(calls):
                nursery.start_soon(one, i, call)
    except BaseExceptionGroup as group:  # the calls are alike: their first failure stands for all
        raise _first(group) from None
    return results


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first failure of a group that is not a cancellation (one of those if all are): what
    callers map to one errno or status (a group was an "internal error" with a traceback and
    EIO, for a listing that met one shard it could not open)."""
    leaves = []
    stack = [group]
    while stack:
        for e in stack.pop().exceptions:
            (stack if isinstance(e, BaseExceptionGroup) else leaves).append(e)
    return next((e for e in leaves if not isinstance(e, trio.Cancelled)), leaves[0])
