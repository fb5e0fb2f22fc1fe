"""A loader leaves no process-wide change behind: torch's functions, collate table and the
garbage collector's frozen objects are as the user had them once the loader is done."""

from __future__ import annotations

import gc

import pytest
import torch
from _datasets import InfoDataset
from torch.utils.data import get_worker_info
from torch.utils.data._utils import collate as torch_collate

import stoker
from stoker.workers import _patches


def _run(backend: str) -> list[dict[str, object]]:
    loader = stoker.DataLoader(
        InfoDataset(8), batch_size=2, num_workers=2, backend=backend, collate_fn=list
    )
    seen = []
    for batch in loader:
        seen.extend(batch)
    del loader
    gc.collect()
    return seen


def test_thread_workers_restore_get_worker_info_and_the_collate_table() -> None:
    code = get_worker_info.__code__
    entry = torch_collate.default_collate_fn_map[torch.Tensor]
    batches = _run("thread")
    # Inside the threads, datasets saw their own worker (the patch was in place then).
    ids = {s["id"] for s in batches}
    assert ids <= {0, 1} and ids, batches
    assert _patches.holders() == 0
    assert get_worker_info.__code__ is code, "torch's get_worker_info is still rewritten"
    assert torch_collate.default_collate_fn_map[torch.Tensor] is entry, "collate table patched"
    assert get_worker_info() is None


def test_a_users_collate_entry_set_while_the_loader_runs_is_kept() -> None:
    entry = torch_collate.default_collate_fn_map[torch.Tensor]

    def mine(batch: list[torch.Tensor], **kwargs: object) -> torch.Tensor:
        return torch.stack(batch)

    loader = stoker.DataLoader(
        InfoDataset(8), batch_size=2, num_workers=2, backend="thread", collate_fn=list
    )
    it = iter(loader)
    next(it)
    torch_collate.default_collate_fn_map[torch.Tensor] = mine
    try:
        for _ in it:
            pass
        del it, loader
        gc.collect()
        assert torch_collate.default_collate_fn_map[torch.Tensor] is mine
    finally:
        torch_collate.default_collate_fn_map[torch.Tensor] = entry


@pytest.mark.parametrize("user_froze", [False, True], ids=["not-frozen", "user-froze"])
def test_fork_workers_keep_the_users_gc_freeze(user_froze: bool) -> None:
    if user_froze:
        gc.freeze()
    try:
        before = gc.get_freeze_count()
        assert (before > 0) == user_froze
        _run("process")
        after = gc.get_freeze_count()
        # Frozen objects still die by reference count: some of the user's may go meanwhile.
        if user_froze:
            assert after > before // 2, f"starting workers unfroze the user's objects ({after})"
        else:
            assert after == 0, f"starting workers left {after} objects frozen"
    finally:
        gc.unfreeze()
