"""The ``remote`` workload: the ``shards`` workload's JPEGs streamed from an S3 store.

The bench starts moto's S3 server behind a proxy that adds latency to every request and caps
each connection's bandwidth (:func:`stoker.bench._s3server.s3_server`; 50 ms and 50 MB/s by
default), puts each contender's format of the same samples in one bucket (see
:mod:`stoker.bench._remote_peers`), then for each repeat and each installed contender runs
one epoch with an empty cache (cold) and one with the cache the cold epoch left (warm),
each from opening the dataset to its last batch. A run records samples/s, the time to the
first batch and the bytes the proxy carried to clients in the epoch.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker._commands.step import consume
from stoker.bench._contenders import close_loader
from stoker.bench._jpeg import FULL_IMAGES, QUICK_IMAGES, ensure_images
from stoker.bench._measure import Meter, TreeMeter
from stoker.bench._plan import Plan, Report
from stoker.bench._remote_peers import BUCKET, MISSING, PEERS, Open, Peer, Source
from stoker.bench._result import ContenderResult, RunSample, WorkloadResult
from stoker.bench._runs import collect_if_held, describe, wait_children_exit, weak
from stoker.bench._s3server import DEFAULT_BANDWIDTH, DEFAULT_LATENCY_S, S3Endpoint, s3_server
from stoker.bench._shards import ShardJpegDataset, ensure_shards
from stoker.bench._stats import median
from stoker.bench._workloads import Workload, cache_dir, register
from stoker.errors import ConfigError

__all__ = ["RemoteSettings", "configured", "remote_workload", "run_remote"]

NAME = "remote"
BATCH_SIZE = 64
SHUFFLE_BUFFER = 1000
STATES = ("cold", "warm")


@dataclass(frozen=True)
class RemoteSettings:
    """The store the ``remote`` workload reads from.

    Attributes:
        latency_s: seconds the proxy adds before each response. Default 0.05.
        bandwidth: bytes per second per connection (``None``: no cap). Default 50e6.
        images: how many of the bench's JPEGs the dataset holds. Default ``None``: 768 in
            quick mode, 3,000 otherwise (as the ``shards`` workload).
    """

    latency_s: float = DEFAULT_LATENCY_S
    bandwidth: float | None = DEFAULT_BANDWIDTH
    images: int | None = None

    def __post_init__(self) -> None:
        if self.latency_s < 0:
            raise ConfigError(f"`latency_s` must be >= 0. Found: {self.latency_s!r}.")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ConfigError(f"`bandwidth` must be > 0 or None. Found: {self.bandwidth!r}.")
        if self.images is not None and self.images < 1:
            raise ConfigError(f"`images` must be >= 1 or None. Found: {self.images!r}.")

    @property
    def text(self) -> str:
        cap = "no cap" if self.bandwidth is None else f"{self.bandwidth / 1e6:g} MB/s"
        return f"{1000 * self.latency_s:g} ms per request, {cap} per connection"


def _epoch(
    peer: Peer, source: Source, how: Open, endpoint: S3Endpoint, expected: int
) -> tuple[RunSample, int]:
    """One epoch from opening the dataset to its last batch -> (the run, bytes downloaded)."""
    baseline = TreeMeter.children_now()
    endpoint.reset()
    loader: Iterable[Any] | None = None
    samples = batches = 0
    first = 0.0
    try:
        with Meter(baseline) as meter:
            t0 = time.perf_counter()
            loader = peer.open(source, how)
            for batch in loader:
                samples += consume(batch)
                del batch
                batches += 1
                if batches == 1:
                    first = time.perf_counter() - t0
            seconds = time.perf_counter() - t0
    finally:
        if loader is not None:
            close_loader(loader)
            ref = weak(loader)
            loader = None
            collect_if_held(ref)  # a full collection only for a loader held in a cycle
        del loader
        wait_children_exit(baseline)
    if samples != expected:
        raise ConfigError(f"{peer.name} delivered {samples} samples in an epoch of {expected}.")
    usage = meter.usage
    assert usage is not None  # set by Meter.__exit__
    run = RunSample(
        seconds=seconds,
        samples=samples,
        batches=batches,
        first_batch_s=first,
        main_cpu_s=usage.main_cpu_s,
        tree_cpu_s=usage.tree_cpu_s,
        peak_pss_bytes=usage.peak_pss_bytes,
    )
    return run, endpoint.reset().bytes_down


@dataclass
class _Tally:
    runs: dict[str, list[RunSample]]
    downloaded: dict[str, list[int]]
    errors: dict[str, str]


def _measure(
    peers: list[Peer], source: Source, endpoint: S3Endpoint, plan: Plan, report: Report
) -> _Tally:
    """Every repeat: each peer (order rotated) cold, then warm from the cold run's cache."""
    names = [f"{p.name} {s}" for p in peers for s in STATES]
    tally = _Tally({n: [] for n in names}, {n: [] for n in names}, {})
    scratch = cache_dir() / "remote-caches"
    scratch.mkdir(exist_ok=True)
    for r in range(plan.repeats):
        for k in range(len(peers)):
            peer = peers[(r + k) % len(peers)]
            cache = Path(tempfile.mkdtemp(prefix=f"{peer.name}-", dir=scratch))
            how = Open(cache, BATCH_SIZE, plan.stoker_workers, r, SHUFFLE_BUFFER,
                       plan.multiprocessing_context)  # fmt: skip
            try:
                for state in STATES:
                    name = f"{peer.name} {state}"
                    if name in tally.errors:
                        report(f"{NAME}: {name}: failed earlier", 1)
                        continue
                    try:
                        run, downloaded = _epoch(peer, source, how, endpoint, len(source.images))
                    except Exception as exc:  # reported in the table; the others still run
                        tally.errors[name] = describe(exc)
                        report(f"{NAME}: {name}: failed ({tally.errors[name]})", 1)
                        continue
                    tally.runs[name].append(run)
                    tally.downloaded[name].append(downloaded)
                    report(
                        f"{NAME}: {name} run {r + 1}/{plan.repeats}: "
                        f"{run.samples_per_s:,.0f} samples/s, first batch "
                        f"{1000 * run.first_batch_s:,.0f} ms, {downloaded / 1e6:,.1f} MB",
                        1,
                    )
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    return tally


def _notes(
    settings: RemoteSettings, plan: Plan, count: int, tally: _Tally, missing: list[str]
) -> list[str]:
    notes = [
        f"store: moto's S3 server behind a proxy adding {settings.text}; {plan.stoker_workers} "
        f"workers, batch {BATCH_SIZE}, shuffled; each run is one epoch of {count:,} samples "
        "from opening the dataset (1st batch ms is from there too); cold = empty cache, "
        "warm = the cold run's cache, in a new loader",
    ]
    sizes = [
        f"{name} {median([float(b) for b in got]) / 1e6:,.1f}"
        for name, got in tally.downloaded.items()
        if got
    ]
    if sizes:
        notes.append("MB downloaded per epoch (median): " + ", ".join(sizes))
    rates = {n: median([r.samples_per_s for r in runs]) for n, runs in tally.runs.items() if runs}
    cold, warm = rates.get("stoker cold"), rates.get("stoker warm")
    if cold and warm:
        notes.append(f"stoker's cold epoch runs at {cold / warm:.2f} of its warm rate")
    for state in STATES:
        mine = rates.get(f"stoker {state}")
        others = [
            f"{n.split()[0]} {rate / mine:.2f}x"
            for n, rate in rates.items()
            if mine and n.endswith(state) and not n.startswith("stoker")
        ]
        if others:
            notes.append(f"{state}, samples/s relative to stoker: " + ", ".join(others))
    notes.extend(missing)
    return notes


def run_remote(
    workload: Workload, plan: Plan, quick: bool, report: Report, settings: RemoteSettings
) -> WorkloadResult:
    """Measure the ``remote`` workload (see the module docstring).

    Args:
        workload: the workload (its name, description and batch size are reported).
        plan: repeats, worker count and start method (``plan.stoker_workers`` workers for
            every contender).
        quick: the quick set of images (768) instead of the full one (3,000), unless
            ``settings.images`` says how many.
        report: progress, one step per run.
        settings: the store's latency and bandwidth.

    Returns:
        The workload's result: one contender per library and cache state; its notes give the
        bytes downloaded per epoch and the ratios to stoker.
    """
    base: dict[str, Any] = {
        "name": workload.name,
        "description": workload.description,
        "batch_size": BATCH_SIZE,
        "mode": "epochs",
    }
    count = settings.images or (QUICK_IMAGES if quick else FULL_IMAGES)
    peers = [p for p in PEERS if p.installed()]
    missing = [
        f"{p.name}: not installed ({p.module}), not compared" for p in PEERS if p not in peers
    ]
    missing += [f"{name}: {why}" for name, why in MISSING.items()]
    try:
        shards, images = ensure_shards(count), tuple(ensure_images(count))
        with s3_server(latency_s=settings.latency_s, bandwidth=settings.bandwidth) as endpoint:
            client = endpoint.client(direct=True)
            try:
                client.create_bucket(Bucket=BUCKET)
                source = Source(shards, images, endpoint.url, client)
                for peer in list(peers):
                    peer.upload(source)
                report(f"{NAME}: {len(peers)} formats in the bucket", 1)
                with endpoint.environ():
                    tally = _measure(peers, source, endpoint, plan, report)
            finally:
                client.close()
    except (ConfigError, ImportError, OSError) as exc:
        report(f"{NAME}: skipped ({describe(exc)})", 1)
        return WorkloadResult(**base, ideal=None, contenders=(), error=describe(exc))
    contenders = tuple(
        ContenderResult(
            name=name,
            library=name.split()[0],
            roles=("stoker",) if name == "stoker cold" else (),
            config={"num_workers": plan.stoker_workers, "cache": name.split()[1]},
            runs=tuple(tally.runs[name]),
            error=tally.errors.get(name),
        )
        for name in tally.runs
    )
    return WorkloadResult(
        **base,
        ideal=None,
        contenders=contenders,
        notes=tuple(_notes(settings, plan, count, tally, missing)),
    )


def remote_workload(settings: RemoteSettings | None = None) -> Workload:
    """The ``remote`` workload with the store's latency and bandwidth of ``settings``."""
    chosen = settings or RemoteSettings()
    return Workload(
        name=NAME,
        description=f"the shards workload's JPEGs streamed from S3 ({chosen.text}), "
        "each library in its own format, cold and warm cache",
        make_dataset=lambda quick: ShardJpegDataset(
            ensure_shards(QUICK_IMAGES if quick else FULL_IMAGES)
        ),
        batch_size=BATCH_SIZE,
        mode="epochs",
        epochs=1,
        runner=functools.partial(run_remote, settings=chosen),
    )


def configured(
    chosen: list[str | Workload] | None, latency_ms: float | None, bandwidth_mbs: float | None
) -> list[str | Workload]:
    """``stoker bench``'s chosen workloads with ``remote`` set to the store's options.

    Args:
        chosen: the workloads named on the command line (``None``: none named).
        latency_ms: ``--latency-ms``, or ``None`` for the default.
        bandwidth_mbs: ``--bandwidth-mbs`` (0: no cap), or ``None`` for the default.

    Raises:
        ConfigError: if ``remote`` is not among ``chosen``, or for a negative value.
    """
    if chosen is None or NAME not in chosen:
        raise ConfigError(
            "`--latency-ms` and `--bandwidth-mbs` set the remote workload's store: add `-w remote`."
        )
    for option, value in (("--latency-ms", latency_ms), ("--bandwidth-mbs", bandwidth_mbs)):
        if value is not None and not value >= 0:
            raise ConfigError(f"`{option}` must be >= 0. Found: {value!r}.")
    settings = RemoteSettings(
        latency_s=DEFAULT_LATENCY_S if latency_ms is None else latency_ms / 1000,
        bandwidth=DEFAULT_BANDWIDTH
        if bandwidth_mbs is None
        else (bandwidth_mbs * 1e6 if bandwidth_mbs else None),
    )
    workload = remote_workload(settings)
    return [workload if w == NAME else w for w in chosen]


register(remote_workload())
