"""Attribute tracking: what the main process rebinds reaches persistent workers."""

from __future__ import annotations

import numpy as np
from torch.utils.data import Dataset, Subset

from stoker.workers._epoch_sync import AttributeTracker, apply_changes


class Epoched(Dataset):
    def __init__(self) -> None:
        self.epoch = 0
        self.items = list(range(10))
        self.table = np.arange(5)
        self.scale = (1.0, 2.0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        return i


def test_nothing_changed_reports_nothing():
    ds = Epoched()
    assert AttributeTracker(ds).changes() == []


def test_rebound_scalar_is_reported_once():
    ds = Epoched()
    tracker = AttributeTracker(ds)
    ds.set_epoch(3)
    assert tracker.changes() == [(("epoch",), 3)]
    assert tracker.changes() == []


def test_equal_scalar_rebinding_is_not_a_change():
    ds = Epoched()
    tracker = AttributeTracker(ds)
    ds.epoch = 0
    ds.scale = (1.0, 2.0)
    assert tracker.changes() == []


def test_replaced_object_is_reported_but_in_place_mutation_is_not():
    ds = Epoched()
    tracker = AttributeTracker(ds)
    ds.items.append(99)  # in place: documented as not seen
    assert tracker.changes() == []
    new = np.zeros(3)
    ds.table = new
    changes = tracker.changes()
    assert len(changes) == 1 and changes[0][0] == ("table",) and changes[0][1] is new


def test_changes_inside_a_wrapped_dataset_are_found_and_applied():
    inner = Epoched()
    wrapped = Subset(inner, [1, 2, 3])
    tracker = AttributeTracker(wrapped)
    inner.set_epoch(7)
    changes = tracker.changes()
    assert changes == [(("dataset", "epoch"), 7)]
    copy = Subset(Epoched(), [1, 2, 3])
    apply_changes(copy, changes)
    assert copy.dataset.epoch == 7


def test_a_rebound_container_hides_changes_beneath_it():
    inner = Epoched()
    wrapped = Subset(inner, [0])
    tracker = AttributeTracker(wrapped)
    replacement = Epoched()
    replacement.epoch = 5
    wrapped.dataset = replacement
    assert tracker.changes() == [(("dataset",), replacement)]


def test_new_attribute_is_reported():
    ds = Epoched()
    tracker = AttributeTracker(ds)
    ds.extra = "x"
    assert tracker.changes() == [(("extra",), "x")]
