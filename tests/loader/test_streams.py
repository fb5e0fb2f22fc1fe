"""StreamRouter: which worker's stream an iterable dataset's next task goes to (torch's rule)."""

from __future__ import annotations

from stoker.loader._streams import StreamRouter

LIMIT = 4  # prefetch_factor 2 x 2 workers


def _send(
    router: StreamRouter, active: list[bool], loading: dict[int, int], idx: int
) -> int | None:
    worker = router.pick(active, loading, LIMIT)
    if worker is not None:
        router.sent(idx, worker)
        loading[idx] = worker
    return worker


def test_in_order_takes_turns_whatever_is_loading() -> None:
    router, loading = StreamRouter(2, in_order=True), {}
    assert [_send(router, [True, True], loading, i) for i in range(6)] == [0, 1, 0, 1, 0, 1]


def test_out_of_order_passes_over_a_worker_at_its_share() -> None:
    router, loading, active = StreamRouter(2, in_order=False), {}, [True, True]
    assert [_send(router, active, loading, i) for i in range(4)] == [0, 1, 0, 1]
    assert router.pick(active, loading, LIMIT) is None  # both at their share of 2
    del loading[1]  # worker 1 answered; worker 0 is stuck on tasks 0 and 2
    assert [_send(router, active, loading, 4)] == [1]
    del loading[3], loading[4]
    assert [_send(router, active, loading, i) for i in (5, 6)] == [1, 1]


def test_an_ended_stream_leaves_its_share_to_the_others() -> None:
    router, loading = StreamRouter(2, in_order=False), {0: 0}
    router.sent(0, 0)
    active = [True, False]
    assert [_send(router, active, loading, i) for i in (1, 2, 3)] == [0, 0, 0]
    assert router.pick(active, loading, LIMIT) is None  # worker 0 holds all 4
    assert router.pick([False, False], {}, LIMIT) is None
