"""pyfuse3's request loop as zvfs runs it (`fronts/fuse_loop.py`), without FUSE: a descriptor
with data waiting is answered at once for at most RUN waits running, then the usual way, which
lets other tasks run; a descriptor with nothing waiting is never answered as readable (the
FUSE descriptor is blocking: a read with no request would stop the loop). The read lock is
taken back by the task that let it go while the run lasts, is taken by the other task when
the first one's answer waits, and is never held by two."""

from __future__ import annotations

import os

import pyfuse3
import pytest
import trio

from zvfs.fronts import fuse_loop


@pytest.fixture
def loop(monkeypatch):
    monkeypatch.setattr(pyfuse3, "trio", trio)
    fuse_loop.install()
    return pyfuse3.trio


async def test_waiting_requests_are_read_without_a_round_each_but_other_tasks_still_run(loop):
    r, w = os.pipe()
    os.write(w, b"x")  # readable, and stays so (never read)
    rounds = 0
    stop = trio.Event()

    async def other() -> None:  # a task that counts the loop's rounds it gets
        nonlocal rounds
        while not stop.is_set():
            rounds += 1
            await trio.lowlevel.checkpoint()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            await trio.lowlevel.checkpoint()
            start = rounds
            waits = 40 * (fuse_loop.RUN + 1)
            for _ in range(waits):
                await loop.lowlevel.wait_readable(r)
            got = rounds - start
            stop.set()
    finally:
        os.close(r)
        os.close(w)
    # one round in RUN + 1 waits: fewer rounds than waits, and never none (the last one may
    # come after the waits end: one fewer, seen once in CI)
    assert waits // (fuse_loop.RUN + 1) - 1 <= got < waits // 2


async def test_a_descriptor_with_nothing_waiting_is_waited_for(loop):
    r, w = os.pipe()
    try:
        with trio.move_on_after(0.2) as waited:
            await loop.lowlevel.wait_readable(r)
        assert waited.cancelled_caught, "answered readable with nothing to read"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(loop.lowlevel.wait_readable, r)
            await trio.sleep(0.05)
            os.write(w, b"x")  # and then it is answered
    finally:
        os.close(r)
        os.close(w)


async def _serve(loop, fd: int, requests: int, handler) -> list[str]:
    """pyfuse3's request loop as its `_session_loop` runs it, with two request tasks: each takes
    the read lock, waits for the descriptor, lets go of the lock, and answers (`handler`).
    Which task read each request, in order."""
    lock, read = loop.Lock(), []
    inside = 0

    async def task(name: str) -> None:
        nonlocal inside
        while len(read) < requests:
            async with lock:
                inside += 1
                assert inside == 1, "two tasks waiting for requests at once"
                await loop.lowlevel.wait_readable(fd)
                inside -= 1
            if len(read) >= requests:
                return
            read.append(name)
            await handler(name)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(task, "a")
            nursery.start_soon(task, "b")
    return read


async def test_the_read_lock_is_taken_back_without_a_round_while_answers_never_wait(loop):
    r, w = os.pipe()
    os.write(w, b"x")
    rounds, stop = 0, trio.Event()

    async def other() -> None:
        nonlocal rounds
        while not stop.is_set():
            rounds += 1
            await trio.lowlevel.checkpoint()

    async def answer(name: str) -> None:  # (an answer with no await, as an open of a cached chunk)
        pass

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            requests = 40 * (fuse_loop.RUN + 1)
            read = await _serve(loop, r, requests, answer)
            stop.set()
    finally:
        os.close(r)
        os.close(w)
    switches = sum(a != b for a, b in zip(read, read[1:]))
    # trio's own Lock hands itself to the waiting task at every release: a switch, and a
    # round, per request (requests - 1 switches)
    assert switches <= 2 * requests // fuse_loop.RUN, f"{switches} switches of reading task in {requests} requests"
    assert rounds >= requests // (fuse_loop.RUN + 1) - 1, "other tasks did not run"


async def test_a_request_is_read_while_another_is_answered(loop):
    r, w = os.pipe()
    os.write(w, b"x")
    answered = trio.Event()

    async def answer(name: str) -> None:  # the first answer waits for the second's
        if not answered.is_set() and name == "a":
            await answered.wait()
        else:
            answered.set()

    try:
        read = await _serve(loop, r, 50, answer)
    finally:
        os.close(r)
        os.close(w)
    assert "b" in read


async def test_a_held_read_lock_is_waited_for(loop):
    r, w = os.pipe()  # nothing to read at first: the task holding the lock waits in it

    async def answer(name: str) -> None:
        await trio.lowlevel.checkpoint()

    async def write_later() -> None:
        await trio.sleep(0.1)
        os.write(w, b"x")

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_later)
            read = await _serve(loop, r, 200, answer)
    finally:
        os.close(r)
        os.close(w)
    assert len(read) == 200


async def test_work_handed_to_another_task_runs_before_the_next_request_is_read(loop):
    """An answer that hands work to another task (a walk's push once its open answered) and
    says so (`round_next`): that task runs before the next request is read."""
    r, w = os.pipe()
    os.write(w, b"x")
    waiting: list[trio.Event] = []
    read_before_it_ran = 0

    async def answer(name: str) -> None:
        nonlocal read_before_it_ran
        read_before_it_ran += sum(not e.is_set() for e in waiting)
        done = trio.Event()
        waiting.append(done)

        async def work() -> None:
            done.set()

        nursery.start_soon(work)
        fuse_loop.round_next()

    try:
        async with trio.open_nursery() as nursery:
            await _serve(loop, r, 300, answer)
    finally:
        os.close(r)
        os.close(w)
    assert read_before_it_ran == 0, f"{read_before_it_ran} requests read before the work handed over ran"


async def test_everything_else_is_trio(loop):
    assert loop.ClosedResourceError is trio.ClosedResourceError and loop.Event is trio.Event
    assert loop.lowlevel.current_task is trio.lowlevel.current_task
