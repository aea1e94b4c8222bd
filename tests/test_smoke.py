from delayq import Queue


def test_schedule_and_get(queue: Queue) -> None:
    tid = queue.schedule("order.close", {"order_id": 42}, delay=900, task_id="order:42")
    assert tid == "order:42"
    info = queue.get("order:42")
    assert info is not None and info.state == "scheduled" and info.payload == {"order_id": 42}
