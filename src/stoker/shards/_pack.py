"""``pack``: a source into indexed tar shards, in parallel, atomically, resumable.

Workers (processes) read and encode samples; the main process appends them, in sample order,
to a :class:`ShardWriter`. The output therefore depends only on the source and
``shard_size``, never on ``workers``. A ``.stoker-pack.json`` written first records the pack's
parameters; ``index.json`` is written last and the state file removed, so a directory with
shards but no index is recognisably unfinished and ``resume=True`` finishes it.

Every file is written under an unpredictable temporary name and renamed into place
(:mod:`stoker.shards._files`), into an output folder that other users cannot write to.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError
from stoker.shards._describe import describe_shard
from stoker.shards._errors import ShardArgumentError, ShardError
from stoker.shards._files import check_output_dir, read_regular, write_atomic
from stoker.shards._index import (
    INDEX_NAME,
    PACK_STATE_NAME,
    ShardIndex,
    ShardInfo,
    write_index,
)
from stoker.shards._sources import Source, SourceFormat, open_source
from stoker.shards._tar import EncodedSample, encode_sample
from stoker.shards._upload import StorePack
from stoker.shards._writer import ShardWriter, shard_name
from stoker.store import StoreURL, parse_url

__all__ = ["DEFAULT_SHARD_SIZE", "pack"]

DEFAULT_SHARD_SIZE = 256 * 1000 * 1000
# Samples handed to a worker at a time; results still come back in order.
CHUNKSIZE = 16
# Chunks in flight per worker: enough to keep every worker busy, few enough that encoded
# samples waiting for an earlier chunk do not pile up in memory.
IN_FLIGHT_PER_WORKER = 4
# Largest .stoker-pack.json read back by --resume (it holds a few short fields).
_MAX_STATE_BYTES = 1 << 20
# Skipped source entries named in the warning.
_SKIPPED_SHOWN = 5

_source: Source | None = None


def _init_worker(source: Source) -> None:
    global _source
    _source = source


def _encode_chunk(indices: range) -> list[EncodedSample]:
    assert _source is not None  # set by _init_worker before any task
    return [_encode_from(_source, i) for i in indices]


def _encode_from(source: Source, index: int) -> EncodedSample:
    key, members = source.sample(index)
    try:
        return encode_sample(key, members)
    except ValueError as exc:
        raise ShardError(f"sample {index} of {source.description}: {exc}") from exc


def _state(source: Source, shard_size: int, follow_links: bool) -> dict[str, Any]:
    state = {"source": source.description, "samples": len(source), "shard_size": shard_size}
    if follow_links:  # absent otherwise, as in the state files of earlier versions
        state["follow_links"] = True
    return state


def _read_state(path: Path) -> object:
    try:
        return json.loads(read_regular(path, _MAX_STATE_BYTES, "pack state").decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise ShardError(
            f"{path} is not a pack state stoker wrote ({exc}): remove the folder's contents "
            "and pack again without `--resume`."
        ) from exc


def _completed(out: Path) -> list[ShardInfo]:
    shards: list[ShardInfo] = []
    while (out / shard_name(len(shards))).exists():
        shards.append(describe_shard(out / shard_name(len(shards))))
    return shards


def _prepare(
    out: Path, source: Source, shard_size: int, resume: bool, follow_links: bool
) -> list[ShardInfo]:
    state = _state(source, shard_size, follow_links)
    state_path = out / PACK_STATE_NAME
    if resume:
        if (out / INDEX_NAME).exists() and not state_path.exists():
            raise ShardArgumentError(
                f"{out} already holds a complete pack ({INDEX_NAME}); nothing to resume."
            )
        if not state_path.exists():
            raise ShardArgumentError(
                f"{out} has no interrupted pack to resume (no {PACK_STATE_NAME}); drop `--resume`."
            )
        check_output_dir(out)
        found = _read_state(state_path)
        if found != state:
            raise ShardArgumentError(
                f"`--resume` must repeat the interrupted pack's source and options: it packed "
                f"{found}, this call packs {state}."
            )
        for tmp in out.glob(".*.tmp"):
            tmp.unlink()
        return _completed(out)
    leftovers = sorted(p.name for p in out.iterdir()) if out.exists() else []
    if leftovers:
        hint = " or finish the interrupted pack with `--resume`" if state_path.exists() else ""
        raise ShardArgumentError(
            f"output directory {out} is not empty ({leftovers[:3]}...): choose an empty one{hint}."
        )
    out.mkdir(parents=True, exist_ok=True)
    check_output_dir(out)
    write_atomic(state_path, json.dumps(state, sort_keys=True).encode())
    return []


def _warn_skipped(source: Source) -> None:
    skipped: list[tuple[str, str]] = getattr(source, "skipped", [])
    if not skipped:
        return
    shown = "; ".join(f"{path!r}: {why}" for path, why in skipped[:_SKIPPED_SHOWN])
    more = f" (and {len(skipped) - _SKIPPED_SHOWN} more)" if len(skipped) > _SKIPPED_SHOWN else ""
    count = "1 entry is" if len(skipped) == 1 else f"{len(skipped)} entries are"
    warnings.warn(
        f"{source.description}: {count} not packed (only regular files inside the source "
        f"are): {shown}{more}.",
        stacklevel=3,
    )


@contextlib.contextmanager
def _encoder(source: Source, workers: int) -> Iterator[Callable[[range], Iterator[EncodedSample]]]:
    """Yields a function mapping indices to encoded samples, in order.

    The pool is created here, before any progress-bar thread starts, so that forking is safe.
    """
    if workers <= 1:
        yield lambda indices: (_encode_from(source, i) for i in indices)
        return
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(
        workers, mp_context=mp.get_context(method), initializer=_init_worker, initargs=(source,)
    )
    try:
        yield lambda indices: _in_order(pool, indices, window=IN_FLIGHT_PER_WORKER * workers)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _WorkerDied(ShardError):
    """A pack worker was killed; the pack can be resumed even before its first shard is done."""


def _in_order(pool: ProcessPoolExecutor, indices: range, window: int) -> Iterator[EncodedSample]:
    """The encoded samples at ``indices``, in order, with at most ``window`` chunks in flight.

    A worker that dies (the kernel's out-of-memory killer) breaks the pool: that is an error
    saying so, where ``multiprocessing.Pool`` waited forever for the dead worker's chunk.
    """
    chunks = (indices[i : i + CHUNKSIZE] for i in range(0, len(indices), CHUNKSIZE))
    try:
        pending = collections.deque(
            pool.submit(_encode_chunk, chunk) for chunk in itertools.islice(chunks, window)
        )
        while pending:
            encoded = pending.popleft().result()
            for chunk in itertools.islice(chunks, 1):
                pending.append(pool.submit(_encode_chunk, chunk))
            yield from encoded
    except BrokenProcessPool as exc:
        raise _WorkerDied(
            "a pack worker died (killed by a signal: the out-of-memory killer?); the shards "
            "written so far are kept: run the same command with `--resume` to finish (with "
            "fewer `--workers` if memory is short)."
        ) from exc


# Over 80 lines: its documented signature; the work is in _prepare, _write_all and _pack_to_store.
def pack(
    source: str | os.PathLike[str] | Source,
    out: str | os.PathLike[str],
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    workers: int = 1,
    resume: bool = False,
    format: SourceFormat = "auto",
    fields: Sequence[str] | None = None,
    progress: bool = False,
    follow_links: bool = False,
) -> ShardIndex:
    """Pack a dataset into WebDataset-compatible tar shards with an ``index.json``.

    Args:
        source: an image-folder tree, a directory of files grouped by stem, an LMDB
            environment, an HDF5 file, ``"module:factory"``, or a :class:`Source`.
        out: output directory; must be empty or absent (unless ``resume``). Or a store
            prefix (``s3://bucket/prefix``, ``gs://``, ``az://``): each finished shard is
            uploaded, ``index.json`` last; ``resume`` works there too.
        shard_size: upper bound of each shard in bytes. Default 256 MB.
        workers: processes reading and encoding samples; the output does not depend on it.
            Default 1 (in the calling process).
        resume: finish an interrupted pack into ``out`` (same source and ``shard_size``).
            Default ``False``.
        format: kind of ``source`` when it is a path; ``"auto"`` (default) guesses.
        fields: HDF5 datasets to pack, or extensions naming the parts of tuple samples.
        progress: show a progress bar (rich) on stderr. Default ``False``.
        follow_links: in a folder source, follow symbolic links whose target lies inside the
            source (each folder is walked once, so a loop ends). Default ``False``: links are
            skipped. Either way FIFOs, sockets and devices are skipped, and every skipped
            entry is named in a warning.

    Returns:
        The index written to ``out/index.json``.

    Raises:
        ConfigError: for a bad ``workers`` or ``shard_size``; a :class:`ShardArgumentError`
            (also a :class:`ShardError`) if the source does not exist or cannot be told
            apart, ``out`` is a file, not empty, writable by other users, or ``resume`` does
            not match the interrupted pack.
        ShardError: if the source cannot be read.
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError(f"`workers` must be an int >= 1. Found: {workers!r}.")
    if not isinstance(follow_links, bool):
        raise ConfigError(f"`follow_links` must be True or False. Found: {follow_links!r}.")
    src = (
        open_source(source, fmt=format, fields=fields, follow_links=follow_links)
        if isinstance(source, str | os.PathLike)
        else source
    )
    _warn_skipped(src)
    target = parse_url(out)
    if isinstance(target, StoreURL):
        return _pack_to_store(src, target, shard_size, workers, resume, progress, follow_links)
    out = target
    if out.exists() and not out.is_dir():
        raise ShardArgumentError(f"output {out} is a file: pass a directory (empty or absent).")
    created = not out.exists()
    done = _prepare(out, src, shard_size, resume, follow_links)
    start = sum(s.samples for s in done)
    writer: ShardWriter | None = None
    try:
        writer = ShardWriter(out, shard_size=shard_size, first_shard=len(done))
        shards = done + _write_all(src, writer, workers, start, progress)
    except BaseException as exc:
        if writer is not None:
            writer.abort()
        # The dead-worker error tells the user to `--resume`, so its state file must stay.
        if not resume and not isinstance(exc, _WorkerDied) and not _completed(out):
            # Nothing to resume: leave no state file to block the corrected command.
            (out / PACK_STATE_NAME).unlink(missing_ok=True)
            if created:
                with contextlib.suppress(OSError):
                    out.rmdir()
        raise
    index = ShardIndex(tuple(shards), dict(src.meta))
    write_index(out, index)
    (out / PACK_STATE_NAME).unlink()
    return index


def _write_all(
    src: Source, writer: ShardWriter, workers: int, start: int, progress: bool
) -> list[ShardInfo]:
    """Encode the source's samples from ``start`` on into ``writer``; its new shards."""
    with _encoder(src, workers) as encode, _Progress(len(src), start, enabled=progress) as bar:
        for sample in encode(range(start, len(src))):
            writer.write(sample)
            bar.advance(len(sample.blob))
        return writer.close()


def _pack_to_store(
    src: Source,
    url: StoreURL,
    shard_size: int,
    workers: int,
    resume: bool,
    progress: bool,
    follow_links: bool,
) -> ShardIndex:
    remote = StorePack(url)
    done = remote.prepare(_state(src, shard_size, follow_links), resume)
    staging = Path(tempfile.mkdtemp(prefix="stoker-pack-"))
    start = sum(s.samples for s in done)
    writer: ShardWriter | None = None
    try:
        writer = ShardWriter(
            staging,
            shard_size=shard_size,
            first_shard=len(done),
            on_shard=lambda info: remote.upload(info, staging / info.name),
        )
        shards = done + _write_all(src, writer, workers, start, progress)
    except BaseException as exc:
        if writer is not None:
            writer.abort()
        if not resume and not isinstance(exc, _WorkerDied) and not (writer and writer.shards):
            remote.abandon()  # nothing uploaded: leave the prefix empty for the corrected call
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    index = ShardIndex(tuple(shards), dict(src.meta))
    remote.finish(index)
    return index


class _Progress:
    """A rich progress bar over samples, with the bytes written; a no-op when disabled."""

    def __init__(self, total: int, done: int, *, enabled: bool) -> None:
        self._bar: Any = None
        self._written = 0
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

            self._bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                "{task.fields[written]}",
                TimeRemainingColumn(),
            )
            self._task = self._bar.add_task("packing", total=total, completed=done, written="")

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self, nbytes: int) -> None:
        if self._bar is not None:
            self._written += nbytes
            self._bar.update(self._task, advance=1, written=f"{self._written / 1e6:,.1f} MB")
