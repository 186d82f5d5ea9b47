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
