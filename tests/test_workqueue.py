"""The work queue: coalescing, one worker per key, the urgent lane, backoff."""

import asyncio

from inferentia_operator.shell.workqueue import WorkQueue


def run(coro):
    return asyncio.run(coro)


def test_a_burst_for_one_key_is_one_item():
    async def scenario():
        q = WorkQueue()
        for _ in range(50):
            q.add(("ns", "a"))
        q.add(("ns", "b"))
        assert len(q) == 2
        assert [await q.get(), await q.get()] == [("ns", "a"), ("ns", "b")]

    run(scenario())


def test_a_key_added_while_worked_on_comes_back_once_after():
    async def scenario():
        q = WorkQueue()
        q.add("a")
        key = await q.get()
        q.add("a")
        q.add("a")
        assert len(q) == 0  # never handed to a second worker while the first has it
        q.done(key)
        assert len(q) == 1 and await q.get() == "a"
        q.done("a")
        assert len(q) == 0

    run(scenario())


def test_urgent_keys_go_ahead_of_a_backlog():
    async def scenario():
        q = WorkQueue()
        for i in range(100):
            q.add(f"status-{i}")
        q.add("new-model", urgent=True)
        q.add("status-50", urgent=True)  # a queued key that turns urgent moves up
        assert [await q.get(), await q.get(), await q.get()] == ["new-model", "status-50", "status-0"]

    run(scenario())


def test_get_waits_for_work():
    async def scenario():
        q = WorkQueue()
        getter = asyncio.ensure_future(q.get())
        await asyncio.sleep(0.01)
        assert not getter.done()
        q.add("a")
        assert await asyncio.wait_for(getter, 1) == "a"

    run(scenario())


def test_backoff_doubles_per_failure_and_resets_on_success():
    q = WorkQueue(base_delay=1, max_delay=10)
    assert [q.retry_delay("a") for _ in range(6)] == [1, 2, 4, 8, 10, 10]
    q.forget("a")
    assert q.retry_delay("a") == 1


def test_each_key_reports_how_long_it_waited_since_it_was_first_queued_and_in_which_lane():
    async def scenario():
        waits: list[tuple[str, float]] = []
        q = WorkQueue(observe_wait=lambda lane, seconds: waits.append((lane, seconds)))
        q.add("old")
        await asyncio.sleep(0.05)
        q.add("old")  # coalesced: its wait still counts from the first add
        q.add("new", urgent=True)
        assert await q.get() == "new" and await q.get() == "old"
        assert [lane for lane, _ in waits] == ["urgent", "normal"]
        assert waits[0][1] < 0.05 <= waits[1][1]

    run(scenario())


def test_a_worker_of_the_urgent_lane_takes_a_new_model_while_the_others_have_a_backlog():
    async def scenario():
        q = WorkQueue()
        for i in range(3):
            q.add(f"status-{i}")
        urgent_worker = asyncio.create_task(q.get(urgent_only=True))
        await asyncio.sleep(0.01)
        assert not urgent_worker.done()  # a backlog of status reconciles is not its work
        q.add("new", urgent=True)
        assert await asyncio.wait_for(urgent_worker, 1) == "new"
        assert await q.get() == "status-0"  # the others' lane is as it was

    run(scenario())
