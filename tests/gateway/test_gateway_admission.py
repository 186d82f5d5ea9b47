"""Admission control: FIFO hand-off, bounded queue, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission import AdmissionController, AdmissionRejected


def test_fifo_handoff_and_rejection():
    async def scenario() -> list[str]:
        admission = AdmissionController(max_running=1, max_waiting=2)
        order: list[str] = []
        await admission.acquire()

        async def waiter(name: str) -> None:
            await admission.acquire()
            order.append(name)

        first = asyncio.create_task(waiter("first"))
        await asyncio.sleep(0)
        second = asyncio.create_task(waiter("second"))
        await asyncio.sleep(0)
        assert (admission.running, admission.waiting) == (1, 2)
        with pytest.raises(AdmissionRejected):
            await admission.acquire()
        admission.release()  # goes to "first", not to a newcomer
        await first
        assert (admission.running, admission.waiting) == (1, 1)
        admission.release()
        await second
        admission.release()
        assert (admission.running, admission.waiting) == (0, 0)
        return order

    assert asyncio.run(scenario()) == ["first", "second"]


def test_cancelled_waiter_leaves_the_queue():
    async def scenario() -> None:
        admission = AdmissionController(max_running=1, max_waiting=1)
        await admission.acquire()
        gone = asyncio.create_task(admission.acquire())
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert admission.waiting == 0
        stays = asyncio.create_task(admission.acquire())  # the freed place is usable
        await asyncio.sleep(0)
        admission.release()
        await stays
        assert admission.running == 1

    asyncio.run(scenario())


def test_slot_released_after_cancel_during_handoff():
    async def scenario() -> None:
        admission = AdmissionController(max_running=1, max_waiting=1)
        await admission.acquire()
        waiter = asyncio.create_task(admission.acquire())
        await asyncio.sleep(0)
        admission.release()  # slot handed to the waiter...
        waiter.cancel()  # ...which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (admission.running, admission.waiting) == (0, 0)

    asyncio.run(scenario())


def test_limits_validated():
    with pytest.raises(ValueError):
        AdmissionController(max_running=0, max_waiting=0)


def test_a_request_takes_one_slot_per_sequence_and_waiters_keep_their_order():
    async def scenario() -> list[str]:
        admission = AdmissionController(max_running=4, max_waiting=4)
        order: list[str] = []
        big = await admission.acquire(3)
        assert big == 3 and (admission.running, admission.slots_used) == (1, 3)

        async def waiter(name: str, sequences: int) -> int:
            slots = await admission.acquire(sequences)
            order.append(name)
            return slots

        pair = asyncio.create_task(waiter("pair", 2))  # 3 + 2 > 4: waits
        await asyncio.sleep(0)
        single = asyncio.create_task(waiter("single", 1))  # would fit, but may not overtake
        await asyncio.sleep(0)
        assert admission.waiting == 2 and order == []
        admission.release(big)
        assert await pair == 2 and await single == 1
        assert order == ["pair", "single"] and (admission.running, admission.slots_used) == (2, 3)
        huge = asyncio.create_task(waiter("huge", 100))  # more than exist: all four, alone
        await asyncio.sleep(0)
        admission.release(2)
        admission.release(1)
        assert await huge == 4 and admission.slots_used == 4
        admission.release(4)
        assert (admission.running, admission.slots_used, admission.waiting) == (0, 0, 0)
        return order

    assert asyncio.run(scenario()) == ["pair", "single", "huge"]


def test_a_cancelled_large_waiter_lets_the_ones_behind_it_in():
    async def scenario() -> None:
        admission = AdmissionController(max_running=2, max_waiting=2)
        await admission.acquire(1)
        large = asyncio.create_task(admission.acquire(2))
        await asyncio.sleep(0)
        small = asyncio.create_task(admission.acquire(1))
        await asyncio.sleep(0)
        assert admission.waiting == 2
        large.cancel()
        with pytest.raises(asyncio.CancelledError):
            await large
        assert await small == 1 and admission.slots_used == 2 and admission.waiting == 0

    asyncio.run(scenario())
