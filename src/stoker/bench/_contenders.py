"""The loaders the bench compares, and how to build each one.

A :class:`ContenderSpec` names a loader configuration and the roles it plays in the
comparison; :func:`build_loader` turns it into an iterable over batches. torch's DataLoader and
stoker's are always available; optional libraries (torchdata nodes, SPDL) register a builder in
``OPTIONAL`` and take part only when they import.
"""

# stoker's loader and watch are imported when a contender is built (start-up of `stoker bench`).

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
import torch.utils.data as tud

from stoker.bench._result import Role
from stoker.errors import ConfigError

__all__ = [
    "OPTIONAL",
    "ContenderSpec",
    "build_loader",
    "close_loader",
    "installed_peers",
    "merge",
    "recommended_workers",
    "standard_contenders",
]


# Seconds a loader with workers may wait for one batch before the contender fails.
BATCH_TIMEOUT_S = 120.0
# Batches an SPDL pipeline's sink buffers (SPDL's own default) unless told otherwise.
SPDL_SINK = 3
# Seconds an SPDL pipeline's threads may take to finish their batches when it stops.
SPDL_STOP_S = 25.0


@dataclass(frozen=True)
class ContenderSpec:
    """A loader configuration to measure.

    Attributes:
        library: ``"torch"``, ``"stoker"`` or an optional library's name.
        num_workers: worker processes (threads for thread-based libraries).
        prefetch_factor: batches in flight per worker (``None`` with no workers or when the
            library's default is used).
        persistent_workers: keep workers between epochs (``None``: the library's default).
        pin_memory: copy batches into page-locked memory.
        roles: what the configuration stands for in the comparison.
    """

    library: str
    num_workers: int
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    pin_memory: bool = False
    roles: tuple[Role, ...] = field(default=(), compare=False)
    auto: bool = False  # stoker with num_workers="auto" (num_workers is then its start)
    watched: bool = False  # stoker wrapped in stoker.watch (measures the monitor's cost)

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ConfigError(f"`num_workers` must be >= 0. Found: {self.num_workers!r}.")
        if self.prefetch_factor is not None and self.prefetch_factor < 1:
            raise ConfigError(
                f"`prefetch_factor` must be >= 1 or None. Found: {self.prefetch_factor!r}."
            )

    @property
    def name(self) -> str:
        """Label for the table: library, then what differs from its defaults."""
        if self.auto:
            return f"{self.library} auto"
        if self.watched:
            return f"{self.library} nw={self.num_workers} watched"
        if self.library == "spdl":
            return f"spdl threads={self.num_workers}"
        if self.library not in ("torch", "stoker") or (
            self.library == "stoker"
            and self.prefetch_factor is None
            and self.persistent_workers is None
        ):
            pf = f" pf={self.prefetch_factor}" if self.prefetch_factor is not None else ""
            return f"{self.library} nw={self.num_workers}{pf}"
        parts = [self.library, f"nw={self.num_workers}"]
        if self.num_workers and self.prefetch_factor is not None:
            parts.append(f"pf={self.prefetch_factor}")
        if self.num_workers and self.persistent_workers is False:
            parts.append("fresh")
        if self.pin_memory:
            parts.append("pin")
        return " ".join(parts)

    @property
    def warm_up_lasts(self) -> bool:
        """Whether a warm-up pass leaves the next epoch anything warm: stoker's workers (and
        its controller) persist by default, and a loader without workers warms its dataset in
        this process; torch's non-persistent workers, and the peers' per-epoch pools, start
        afresh with the timed epoch, so their warm-up pass would only cost time."""
        if self.library == "stoker":
            return self.auto or self.persistent_workers is not False
        if self.library == "torch":
            return self.num_workers == 0 or bool(self.persistent_workers)
        return False

    @property
    def width(self) -> int:
        """Batches the loader builds at once: one per worker process or thread (1 with none).

        A loader that builds many at once delivers them in waves (SPDL's 64 threads on 2 cores
        finish their 64 batches together): a timed window starts after the first wave.
        """
        return max(1, self.num_workers)

    @property
    def in_flight(self) -> int:
        """At most how many batches the loader holds built or being built ahead of its
        consumer (0: it builds each batch when asked)."""
        if self.library in OPTIONAL:
            return OPTIONAL[self.library][1].in_flight(self)
        if self.num_workers == 0 and not self.auto:
            return 0
        if self.auto:  # it may grow past its start, and sizes its own prefetch
            from stoker.autotune._prefetch import MAX_PREFETCH

            return 2 * self.width * MAX_PREFETCH
        return self.num_workers * (self.prefetch_factor or 2)

    @property
    def config(self) -> dict[str, Any]:
        return {
            "num_workers": "auto" if self.auto else self.num_workers,
            "prefetch_factor": self.prefetch_factor,
            "persistent_workers": self.persistent_workers,
            "pin_memory": self.pin_memory,
        }


def recommended_workers(cores: int) -> int:
    """The seed articles' rule of thumb: 0.7 x cores workers, at least 1."""
    return max(1, round(0.7 * cores))


def standard_contenders(
    cores: int,
    stoker_workers: int,
    best: ContenderSpec | None,
    same_prefetch: int,
    stoker_auto: bool = False,
    stoker_watched: bool = False,
    references: bool = True,
) -> list[ContenderSpec]:
    """torch's reference configurations and stoker with its defaults (before merging).

    Args:
        cores: usable cores.
        stoker_workers: stoker's ``num_workers``.
        best: torch's best grid configuration, if a grid ran.
        same_prefetch: torch's better ``prefetch_factor`` at ``stoker_workers``.
        stoker_auto: also stoker with ``num_workers="auto"`` (and ``prefetch_factor="auto"``).
        stoker_watched: also stoker's defaults wrapped in ``stoker.watch`` (its overhead).
        references: also torch with no workers and torch's seed recipe.
    """
    cuda = torch.cuda.is_available()
    # In the order the table shows them: what the README recommends first, then the
    # same-workers comparison, then torch's other references.
    specs = []
    if stoker_auto:
        specs.append(ContenderSpec("stoker", stoker_workers, auto=True, roles=("stoker-auto",)))
    specs += [
        ContenderSpec("stoker", stoker_workers, roles=("stoker",)),
        ContenderSpec("torch", stoker_workers, same_prefetch, True, roles=("torch-same",)),
    ]
    if best is not None:
        specs.append(replace(best, roles=("torch-best",)))
    if references:
        specs += [
            ContenderSpec("torch", 0, roles=("torch-nw0",)),
            ContenderSpec(
                "torch", recommended_workers(cores), 4, True, cuda, roles=("torch-recommended",)
            ),
        ]
    if stoker_watched:
        specs.append(
            ContenderSpec("stoker", stoker_workers, watched=True, roles=("stoker-watched",))
        )
    return specs


def merge(specs: Sequence[ContenderSpec]) -> list[ContenderSpec]:
    """Merge identical configurations (same library and arguments), joining their roles."""
    out: list[ContenderSpec] = []
    for spec in specs:
        for i, seen in enumerate(out):
            if seen == spec:
                roles = seen.roles + tuple(r for r in spec.roles if r not in seen.roles)
                out[i] = replace(seen, roles=roles)
                break
        else:
            out.append(spec)
    return out


def build_loader(
    spec: ContenderSpec,
    dataset: Any,
    batch_size: int,
    sampler: Iterable[int] | None,
    multiprocessing_context: str | None = None,
) -> Iterable[Any]:
    """Build the iterable over batches that ``spec`` describes.

    Raises:
        ConfigError: if ``spec.library`` has no builder.
        ImportError: if an optional library is not installed.
    """
    kwargs: dict[str, Any] = {"batch_size": batch_size, "sampler": sampler}
    if spec.num_workers or spec.auto:
        kwargs["multiprocessing_context"] = multiprocessing_context
    if spec.num_workers and not spec.auto:
        # A hung worker fails its contender (reported) instead of the whole bench. Not for
        # num_workers="auto": a timeout keeps its first batch out of the main process
        # (stoker.loader._main_first), where a user's loader, without one, loads it; the
        # run's own time limit (_runs.RUN_LIMIT_S) catches a hang there.
        kwargs["timeout"] = BATCH_TIMEOUT_S
    if spec.library == "torch":
        return tud.DataLoader(
            dataset,
            num_workers=spec.num_workers,
            pin_memory=spec.pin_memory,
            prefetch_factor=spec.prefetch_factor if spec.num_workers else None,
            persistent_workers=bool(spec.persistent_workers) and spec.num_workers > 0,
            **kwargs,
        )
    if spec.library == "stoker":
        from stoker.loader._loader import DataLoader

        if spec.prefetch_factor is not None:
            kwargs["prefetch_factor"] = spec.prefetch_factor
        if spec.persistent_workers is not None:
            kwargs["persistent_workers"] = spec.persistent_workers
        if spec.auto:
            kwargs["prefetch_factor"] = "auto"
            return DataLoader(dataset, num_workers="auto", pin_memory=spec.pin_memory, **kwargs)
        if spec.watched:
            from stoker.monitor import watch

            inner: Any = DataLoader(
                dataset, num_workers=spec.num_workers, pin_memory=spec.pin_memory, **kwargs
            )
            return watch(inner, every=100, progress=False)
        return DataLoader(
            dataset, num_workers=spec.num_workers, pin_memory=spec.pin_memory, **kwargs
        )
    if spec.library in OPTIONAL:
        return OPTIONAL[spec.library][1](spec, dataset, batch_size, sampler)
    raise ConfigError(f"no loader builder for library {spec.library!r}.")


def close_loader(loader: Iterable[Any]) -> None:
    """Stop a loader's workers now rather than at garbage collection.

    Calls the first of ``_shutdown_workers`` (torch), ``_shutdown`` (stoker) or ``close`` that
    the loader's live iterator has, then the loader's own ``close`` if it has one.
    """
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        for name in ("_shutdown_workers", "_shutdown", "close"):
            shutdown = getattr(iterator, name, None)
            if callable(shutdown):
                shutdown()
                break
        loader._iterator = None  # type: ignore[attr-defined]
    close = getattr(loader, "close", None)
    if callable(close):
        close()


class _FetchBatch:
    """Picklable ``indices -> collated batch`` for libraries that map over index batches."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __call__(self, indices: list[int]) -> Any:
        return tud.default_collate([self.dataset[i] for i in indices])


def _index_batches(sampler: Iterable[int] | None, n: int, batch_size: int) -> Iterator[list[int]]:
    return iter(tud.BatchSampler(sampler if sampler is not None else range(n), batch_size, False))


class _TorchdataNodesLoader:
    """torchdata.nodes: index batches -> ParallelMapper (processes) -> Prefetcher -> Loader."""

    def __init__(
        self, spec: ContenderSpec, dataset: Any, batch_size: int, sampler: Iterable[int] | None
    ) -> None:
        self.spec, self.dataset, self.batch_size, self.sampler = spec, dataset, batch_size, sampler
        self._mapper: Any = None

    @staticmethod
    def in_flight(spec: ContenderSpec) -> int:
        """The mapper's tasks (twice its workers, torchdata's default) and the prefetcher's."""
        return 2 * spec.width + (spec.prefetch_factor or 2)

    def close(self) -> None:
        """Stop the mapper's worker processes now.

        torchdata stops them only when its iterator is collected; collected in a worker that
        a later contender forked, its ``__del__`` fails there ("can only test a child
        process"). Its iterator has no public stop: ``_shutdown`` is found along ``_it``.
        """
        node, mapper = self._mapper, None
        for _ in range(3):
            node = getattr(node, "_it", None)
            if callable(getattr(node, "_shutdown", None)):
                mapper = node
        if mapper is not None:
            mapper._shutdown()
        self._mapper = None

    def __iter__(self) -> Iterator[Any]:
        from torchdata import nodes

        batches = _index_batches(self.sampler, len(self.dataset), self.batch_size)
        node = nodes.IterableWrapper(batches)
        node = nodes.ParallelMapper(
            node,
            map_fn=_FetchBatch(self.dataset),
            num_workers=self.spec.width,
            method="process",
        )
        self._mapper = node
        node = nodes.Prefetcher(node, prefetch_factor=self.spec.prefetch_factor or 2)
        yield from nodes.Loader(node)


class _SpdlLoader:
    """SPDL: index batches -> fetch + collate in a thread pool -> sink buffer."""

    def __init__(
        self, spec: ContenderSpec, dataset: Any, batch_size: int, sampler: Iterable[int] | None
    ) -> None:
        self.spec, self.dataset, self.batch_size, self.sampler = spec, dataset, batch_size, sampler
        self._pipeline: Any = None

    def close(self) -> None:
        """Stop the pipeline, waiting (up to :data:`SPDL_STOP_S`) for its threads to finish
        the batches they are building.

        SPDL's own stop gives up after about 6 s (3 s to join, 3 s draining the sink) and
        leaves them running: 64 threads on 2 cores were still building batches then, beside
        the next contender's run.
        """
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline.stop(timeout=SPDL_STOP_S)

    @staticmethod
    def sink(spec: ContenderSpec) -> int:
        """Batches the sink buffers: ``prefetch_factor``, else SPDL's default (3).

        Not more: with a sink of twice the threads, 64 threads on jpeg could hold 192 batches
        of 37 MiB beside a slow CPU step, and the bench was killed for memory (23 GiB
        anonymous RSS).
        """
        return spec.prefetch_factor or SPDL_SINK

    @staticmethod
    def in_flight(spec: ContenderSpec) -> int:
        """One batch being built per thread, and the sink's."""
        return spec.width + _SpdlLoader.sink(spec)

    def __iter__(self) -> Iterator[Any]:
        from spdl.pipeline import PipelineBuilder

        threads = self.spec.width
        builder: Any = PipelineBuilder()  # typed generics that an index source does not meet
        pipeline = (
            builder.add_source(_index_batches(self.sampler, len(self.dataset), self.batch_size))
            # SPDL's default, stated: what its users get (see PEER_ORDER_NOTES).
            .pipe(_FetchBatch(self.dataset), concurrency=threads, output_order="completion")
            .add_sink(self.sink(self.spec))
            .build(num_threads=threads)
        )
        self._pipeline = pipeline
        pipeline.start()
        try:
            yield from pipeline
        finally:
            self.close()


class Builder(Protocol):
    """An optional library's loader: built from a spec, and how much it holds in flight."""

    def __call__(
        self, spec: ContenderSpec, dataset: Any, batch_size: int, sampler: Iterable[int] | None
    ) -> Iterable[Any]: ...

    def in_flight(self, spec: ContenderSpec) -> int: ...


# library -> (module that must import, builder). Add a library here to put it in the table.
OPTIONAL: dict[str, tuple[str, Builder]] = {
    "torchdata": ("torchdata.nodes", _TorchdataNodesLoader),
    "spdl": ("spdl.pipeline", _SpdlLoader),
}


# How a peer's delivery differs from torch's (the sampler's order), said under every table it
# is compared in. SPDL's pipe delivers a batch as soon as it is built, by default: a batch held
# up by a slow sample does not hold the later ones back, as it does in torch's in-order loader
# and stoker's (``in_order=True``); on heavytail (1% of samples wait 150 ms) SPDL at 32 threads
# ran as fast with ``output_order="input"`` (benchmarks/README.md, "heavytail").
PEER_ORDER_NOTES: dict[str, str] = {
    "spdl": (
        "spdl: batches in the order they are built (its default, output_order='completion'),"
        " not the sampler's: torch, torchdata.nodes and stoker keep the sampler's order"
        " (in_order=True)"
    ),
}


def installed_peers() -> tuple[list[str], list[str]]:
    """The optional libraries that import, and for each that does not a note saying why."""
    found: list[str] = []
    notes: list[str] = []
    for library, (module, _) in OPTIONAL.items():
        try:
            present = importlib.util.find_spec(module.split(".")[0]) is not None
        except (ImportError, ValueError):
            present = False
        if not present:
            notes.append(f"{library} not installed (pip install 'stoker[bench]'): not compared")
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:  # installed but broken beside this torch: say so, go on
            notes.append(f"{library} does not import ({type(exc).__name__}: {exc}): not compared")
            continue
        found.append(library)
    return found, notes
