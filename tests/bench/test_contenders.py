"""Contender configurations: names, merging of identical ones, optional libraries."""

from __future__ import annotations

import torch.utils.data as tud

from stoker.bench._contenders import (
    OPTIONAL,
    ContenderSpec,
    build_loader,
    close_loader,
    merge,
    optional_contenders,
    recommended_workers,
    standard_contenders,
)
from stoker.bench._synthetic import TinyDataset


def test_recommended_workers_is_seventy_percent_of_cores() -> None:
    assert [recommended_workers(n) for n in (1, 2, 4, 8, 16)] == [1, 1, 3, 6, 11]


def test_names_show_what_differs() -> None:
    assert ContenderSpec("torch", 0).name == "torch nw=0"
    assert ContenderSpec("torch", 2, 4, True).name == "torch nw=2 pf=4"
    assert ContenderSpec("torch", 2, 2, False).name == "torch nw=2 pf=2 fresh"
    assert ContenderSpec("stoker", 2).name == "stoker nw=2"


def test_merge_joins_roles_of_identical_configurations() -> None:
    best = ContenderSpec("torch", 2, 2, True)
    specs = merge(standard_contenders(cores=2, stoker_workers=2, best=best, same_prefetch=2))
    names = [s.name for s in specs]
    assert names == ["torch nw=0", "torch nw=1 pf=4", "torch nw=2 pf=2", "stoker nw=2"]
    assert specs[2].roles == ("torch-same", "torch-best")


def test_best_at_zero_workers_merges_with_the_baseline() -> None:
    specs = merge(standard_contenders(2, 2, ContenderSpec("torch", 0), 4))
    assert specs[0].roles == ("torch-nw0", "torch-best")
    assert [s.name for s in specs][2] == "torch nw=2 pf=4"


def test_missing_optional_libraries_are_noted_not_run() -> None:
    specs, notes = optional_contenders(2)
    assert {s.library for s in specs} | {n.split()[0] for n in notes} == set(OPTIONAL)
    for note in notes:
        assert note.endswith("not installed: not compared")


def test_build_loader_makes_torch_and_stoker_loaders() -> None:
    ds = TinyDataset(n=64)
    torch_loader = build_loader(ContenderSpec("torch", 0), ds, 16, range(64))
    assert isinstance(torch_loader, tud.DataLoader)
    assert sum(b.shape[0] for b in torch_loader) == 64
    close_loader(torch_loader)
    from stoker import DataLoader

    stoker_loader = build_loader(ContenderSpec("stoker", 0), ds, 16, range(64))
    assert isinstance(stoker_loader, DataLoader)


def test_full_mode_adds_auto_and_watched_stoker() -> None:
    from stoker.bench._contenders import build_loader, close_loader, standard_contenders

    specs = standard_contenders(2, 2, None, 2, stoker_auto=True, stoker_watched=True)
    by_role = {r: s for s in specs for r in s.roles}
    assert by_role["stoker-auto"].name == "stoker auto"
    assert by_role["stoker-auto"].config["num_workers"] == "auto"
    watched = by_role["stoker-watched"]
    assert watched.name == "stoker nw=2 watched"
    loader = build_loader(watched, list(range(8)), 4, None)
    batches = [b.tolist() for b in loader]
    assert type(loader).__name__ == "Watch" and batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    close_loader(loader)
    quick = standard_contenders(2, 2, None, 2)
    assert not any({"stoker-auto", "stoker-watched"} & set(s.roles) for s in quick)
