"""The JSON schema round trip, the verdicts and the terminal table."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from stoker.bench._json import SCHEMA, from_json, read_json, to_json, write_json
from stoker.bench._report import render, verdict
from stoker.errors import ConfigError

from ._factories import contender, result, workload


def test_json_round_trip_preserves_every_measurement(tmp_path: Path) -> None:
    original = result(workload("tiny"), workload("jpeg", stoker_error="ValueError: x"))
    path = tmp_path / "out.json"
    write_json(original, path)
    again = read_json(path)
    assert again == original
    assert to_json(again) == to_json(original)


def test_json_document_shape_and_derived_fields() -> None:
    doc = json.loads(json.dumps(to_json(result())))
    assert doc["schema"] == SCHEMA == "stoker.bench/1"
    assert set(doc) == {
        "schema",
        "started_at",
        "duration_s",
        "quick",
        "repeats",
        "machine",
        "workloads",
    }
    w = doc["workloads"][0]
    assert w["torch_best"] == "torch nw=1 pf=4"
    assert w["ideal"]["samples_per_s"] == pytest.approx(500.0)
    assert w["verdict"].startswith("loader: stoker nw=2 2.00x faster than torch's best here")
    st = w["contenders"][-1]
    assert st["summary"]["ratio_to_torch_best"] == pytest.approx(2.0)
    assert st["summary"]["ratio_to_torch_same"] == pytest.approx(2.4)
    assert st["summary"]["fraction_of_ideal"] == pytest.approx(0.6)
    assert len(st["runs"]) == 3
    assert set(st["runs"][0]) == {
        "seconds",
        "samples",
        "batches",
        "first_batch_s",
        "main_cpu_s",
        "tree_cpu_s",
        "peak_pss_bytes",
        "epoch_first_batch_s",
        "monitor_overhead_s",
    }
    assert w["grid"][2] == {
        "num_workers": 4,
        "prefetch_factor": 2,
        "samples_per_s": None,
        "error": "boom",
        "library": "torch",
    }


def test_json_rejects_other_schemas_and_malformed_documents() -> None:
    with pytest.raises(ConfigError, match=r"not a stoker\.bench/1 document"):
        from_json({"schema": "stoker.bench/0"})
    with pytest.raises(ConfigError, match=r"not a stoker\.bench/1 document"):
        from_json([])  # type: ignore[arg-type]
    doc = to_json(result())
    del doc["workloads"][0]["contenders"][0]["runs"][0]["samples"]
    with pytest.raises(ConfigError, match="malformed"):
        from_json(doc)


def test_verdict_faster_slower_par_and_failed() -> None:
    assert verdict(workload(stoker_rates=(300.0,))) == (
        "loader: stoker nw=2 2.00x faster than torch's best here (torch nw=1 pf=4); "
        "same workers: stoker nw=2 2.40x faster than torch at the same 2 workers "
        "(torch nw=2 pf=2); stoker nw=2 at 60% of this machine's limit"
    )
    assert verdict(workload(stoker_rates=(75.0,))).startswith(
        "loader: stoker nw=2 2.00x slower than torch's best here"
    )
    # torch's best ran 140 to 160 (±7%): 1.01x is within the run's own spread.
    assert verdict(workload(stoker_rates=(151.0,))).startswith(
        "loader: stoker nw=2 on par with torch's best here (torch nw=1 pf=4) (1.01x, spread ±7%)"
    )
    assert verdict(workload(stoker_error="OSError: shm")) == "stoker failed: OSError: shm"


def test_no_verdict_reads_slower_within_the_spread() -> None:
    # 0.90x, but torch's best ran 120 to 180 (±20%): on par, not slower.
    import dataclasses

    from ._factories import contender

    w = workload(stoker_rates=(135.0,))
    wide = contender("torch nw=1 pf=4", "torch", ("torch-best",), 150.0, 120.0, 180.0, nw=1)
    w = dataclasses.replace(w, contenders=(*w.contenders[:1], wide, *w.contenders[2:]))
    text = verdict(w)
    assert "slower" not in text.split(";")[0] and "on par" in text.split(";")[0]


def test_verdict_leads_with_auto_then_same_workers_then_peers() -> None:
    import dataclasses

    from ._factories import contender

    w = workload()
    auto = contender("stoker auto", "stoker", ("stoker-auto",), 400.0, 410.0, 390.0, nw=2)
    spdl = contender("spdl threads=8", "spdl", ("optional",), 200.0, 200.0, nw=8)
    w = dataclasses.replace(w, contenders=(auto, *w.contenders, spdl))
    parts = verdict(w).split("; ")
    assert parts[0].startswith("loader: stoker auto 2.67x faster than torch's best here")
    assert parts[1].startswith("same workers: stoker nw=2 2.40x faster than torch at the same")
    assert parts[2] == "loader: stoker auto 2.00x faster than spdl's best (spdl threads=8)"


def test_render_prints_tables_verdicts_and_total_time() -> None:
    buf = io.StringIO()
    render(result(workload("tiny"), workload("jpeg")), Console(file=buf, width=160))
    text = buf.getvalue()
    for expected in (
        "tiny",
        "jpeg",
        "torch nw=1 pf=4",
        "stoker nw=2",
        "verdict:",
        "2.00x",
        "total time",
        "a note",
        "ideal 500 samples/s",
    ):
        assert expected in text


def test_verdict_mentions_memory_only_when_it_differs() -> None:
    from stoker.bench._result import WorkloadResult

    from ._factories import contender

    w = workload()
    assert "PSS" not in verdict(w)
    heavy = contender("stoker nw=2", "stoker", ("stoker",), 300.0, nw=2, peak_pss_bytes=600 * 2**20)
    w2 = WorkloadResult(**{**vars(w), "contenders": (*w.contenders[:3], heavy)})
    assert verdict(w2).endswith("PSS 600 MiB vs 300 MiB for torch at the same workers")


def test_ramps_and_watch_cost_reach_the_verdict_and_survive_json() -> None:
    import dataclasses

    from stoker.bench._result import Ramp

    from ._factories import contender

    w = workload()
    auto = contender("stoker auto", "stoker", ("stoker-auto",), 320.0, 330.0, nw=2)
    ramps = (
        Ramp(1, 10.0, 325.0, 1.5, 30.0, 4, "process", ("backend=process: ...",)),
        Ramp(16, 10.0, 325.0, None, 30.0, 16, "process"),
    )
    w = dataclasses.replace(w, contenders=(*w.contenders, auto), ramps=ramps)
    text = verdict(w)
    assert "auto ramp from 1: 1.5 s, 5.0% of an epoch (-> 4 process)" in text
    assert "from 16: not within 10 s" in text
    doc = to_json(result(w))
    back = from_json(json.loads(json.dumps(doc)))
    assert back.workloads[0].ramps == ramps
    assert doc["workloads"][0]["ramps"][0]["share_of_epoch"] == pytest.approx(0.05)


def test_an_ideal_that_is_no_limit_gives_no_fraction() -> None:
    # Issue 31: on `large` stoker read "7,702% of this machine's limit", because it skips the
    # allocation and page faults of default_collate that the ideal measures.
    import dataclasses

    from stoker.bench._workloads import get_workload

    assert get_workload("large").ideal_is_limit is False
    assert get_workload("tiny").ideal_is_limit is True
    limited = workload()
    assert limited.ideal is not None
    w = dataclasses.replace(limited, ideal=dataclasses.replace(limited.ideal, is_limit=False))
    st = w.stoker
    assert st is not None and w.fraction_of_ideal(st) is None
    assert "limit" not in verdict(w) and "% of" not in verdict(w)
    assert verdict(limited).endswith("at 60% of this machine's limit")
    buf = io.StringIO()
    render(result(w), Console(file=buf, width=200))
    text = buf.getvalue()
    assert "reference (not a limit here, no % ideal) 500 samples/s" in text
    assert "60%" not in text
    doc = to_json(result(w))
    assert doc["workloads"][0]["ideal"]["is_limit"] is False
    assert doc["workloads"][0]["contenders"][-1]["summary"]["fraction_of_ideal"] is None
    assert from_json(doc) == result(w)
    del doc["workloads"][0]["ideal"]["is_limit"]  # a document written before the field
    ideal = from_json(doc).workloads[0].ideal
    assert ideal is not None and ideal.is_limit


def test_table_plot_and_roles_line_use_the_same_words() -> None:
    from stoker.bench._plot import _SERIES
    from stoker.bench._roles import ROLE_TEXT, ROLES_EXPLAINED

    buf = io.StringIO()
    render(result(), Console(file=buf, width=400))
    text = " ".join(buf.getvalue().split())
    assert " ".join(ROLES_EXPLAINED.split()) in text
    for role, legend, _colour in _SERIES:
        if role == "optional":
            continue
        words = ROLE_TEXT[role]  # type: ignore[index]
        assert legend.endswith(f", {words}")
        assert f"{words} = " in ROLES_EXPLAINED  # explained in the one roles line
        assert words in text  # and the table's role column says it
    assert "seed-recommended" not in " ".join(legend for _, legend, _ in _SERIES)


def test_a_cold_and_warm_workload_compares_each_state_with_the_same_state() -> None:
    def state(name: str, library: str, cache: str, rate: float, first_s: float):
        c = contender(name, library, ("stoker",) if name == "stoker cold" else (), rate,
                      rate, nw=2, first_batch_s=first_s)  # fmt: skip
        return dataclasses.replace(c, config={**c.config, "cache": cache})

    w = dataclasses.replace(
        workload(name="remote", mode="epochs"),
        ideal=None,
        contenders=(
            state("stoker cold", "stoker", "cold", 200.0, 1.5),
            state("stoker warm", "stoker", "warm", 300.0, 0.8),
            state("webdataset cold", "webdataset", "cold", 100.0, 2.0),
            state("webdataset warm", "webdataset", "warm", 400.0, 0.5),
        ),
    )
    assert verdict(w).split("; ") == [
        "cold: stoker cold 2.00x faster than webdataset cold",
        "cold first batch 1,500 ms vs 2,000 ms (webdataset cold)",
        "warm: stoker warm 1.33x slower than webdataset warm",
        "warm first batch 800 ms vs 500 ms (webdataset warm)",
    ]


def _against(mine: tuple[float, ...], theirs: tuple[float, ...]) -> str:
    """The verdict's first part: stoker (``mine``) against torch's best (``theirs``)."""
    import dataclasses

    from ._factories import contender

    w = workload(stoker_rates=mine)
    best = contender("torch nw=1 pf=4", "torch", ("torch-best",), *theirs, nw=1)
    w = dataclasses.replace(w, contenders=(*w.contenders[:1], best, *w.contenders[2:]))
    return verdict(w).split(";")[0]


def test_runs_that_overlap_read_on_par_whatever_one_run_does_to_the_spread() -> None:
    # 0.92x, beyond both half-range spreads (5%, 7%), yet stoker's best run beats torch's
    # worst: three runs cannot tell these apart (the old rule said "1.09x slower").
    text = _against((203.0, 213.0, 224.0), (216.0, 232.0, 248.0))
    assert "on par" in text and "0.92x" in text and "runs overlap" in text, text
    # All three below all three: told apart, both ways.
    assert "1.10x slower" in _against((200.0, 205.0, 210.0), (215.0, 225.0, 230.0))
    assert "1.10x faster" in _against((215.0, 225.0, 230.0), (200.0, 205.0, 210.0))
    # One wild run of theirs no longer hides a difference every other run shows.
    assert "slower" in _against((200.0, 201.0, 202.0), (220.0, 221.0, 800.0))
    # Five against five: one overlapping pair still leaves p = 2/252.
    five = _against((200.0, 201.0, 202.0, 203.0, 210.0), (209.0, 211.0, 212.0, 213.0, 214.0))
    assert "slower" in five, five
    # Inside the 3% band: on par, however far apart the runs.
    assert "on par" in _against((200.0, 201.0, 202.0), (204.0, 205.0, 206.0))


def test_fewer_runs_on_one_side_still_tell_a_clean_gap_apart() -> None:
    # Three against two reach p = 0.1 at best: all of one above all of the other suffices.
    assert "2.00x faster" in _against((300.0, 305.0, 310.0), (150.0, 155.0))
    assert "on par" in _against((300.0, 305.0, 310.0), (150.0, 400.0))
