"""The head start's batch loaded in parts side by side (inside its child, stoker.loader._head).

A worker loads a batch's samples one after another, and so did the head start's child: its
first batch could come no sooner than ``num_workers=0``'s, and came later (the child starts
after two forks). Here the child splits the batch's indices into contiguous parts, one per
usable core (at most :data:`HEAD_MAX_PARTS`), forks a helper per part after the first, right
after seeding the batch and before reading the dataset, and loads the first part itself; the
helpers wait until the child's first few samples show that splitting pays (see
:func:`load_in_parts`), then each loads its part, hands its samples over through a memory file
(:func:`~stoker.transport._handoff.pack`) and exits. The child collates all the samples as a
worker would.

The batch must be the one a worker loads, sample for sample. A helper's part starts from the
state the child had right after seeding, as forked; a worker's from the state the samples before
it left. Those are the same where the samples before it left the global random generators
(torch's, ``random``'s, numpy's legacy one) as seeded: before taking a part, the child checks
that its own generators still stand as seeded, and each helper reports whether its part left
them so. Where either check fails (a dataset that draws augmentations from them), the child
loads that part itself, as it did before; then the later parts too, as its generators moved.
A helper that fails, or a sample that cannot be handed over, leaves its part to the child.
Split only where a batch is ``collate_fn([dataset[i] for i in index])`` exactly (see
:attr:`~stoker.workers._fetch.BatchFetcher.one_by_one`). Not caught: a dataset whose samples
depend on what loading the earlier samples of the batch changed in it, other than those
generators (a counter of calls, say); each worker has its own such state anyway.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import random
import select
import signal
import socket
import struct
import sys
import time
from typing import Any

import torch

from stoker._introspect.platform import set_parent_death_signal, usable_cores
from stoker.transport._handoff import pack, unpack

__all__ = [
    "HEAD_MAX_PARTS",
    "HEAD_MIN_PART",
    "HEAD_SPLIT_MIN_S",
    "Helpers",
    "die_with_parent",
    "load_in_parts",
    "part_count",
]

# The most parts a batch is loaded in (each part after the first costs the child a fork).
HEAD_MAX_PARTS = 4
# The fewest samples a part holds.
HEAD_MIN_PART = 4
# A batch that would take less than this at the pace of the quickest of the child's first
# samples loads in one part.
HEAD_SPLIT_MIN_S = 0.05
# Samples the child loads before deciding whether its helpers go on.
PACE_SAMPLES = 3
# Longest the child waits for a helper's part before loading it itself.
HELPER_WAIT_S = 10.0
_PROTOCOL = 5
# What the child sends a helper to start loading.
_GO = b"g"
_MSG_BYTES = 1 << 16


def die_with_parent() -> None:
    """Have the kernel kill this forked process when its parent dies (Linux; elsewhere a
    no-op). Called from the parent's main thread only: the signal comes when the thread
    that forked exits."""
    set_parent_death_signal(signal.SIGKILL)


def part_count(batch_size: int) -> int:
    """Parts a batch of ``batch_size`` samples is loaded in: one per usable core, at most
    :data:`HEAD_MAX_PARTS`, each of :data:`HEAD_MIN_PART` samples or more."""
    return max(1, min(usable_cores(), HEAD_MAX_PARTS, batch_size // HEAD_MIN_PART))


def split(index: list[Any], count: int) -> list[list[Any]]:
    """``index`` cut into ``count`` contiguous parts, the longer ones first."""
    size, extra = divmod(len(index), count)
    parts, at = [], 0
    for k in range(count):
        end = at + size + (k < extra)
        parts.append(index[at:end])
        at = end
    return parts


def rng_fingerprint() -> bytes:
    """A digest of the global random generators' states: torch's CPU one, ``random``'s and
    numpy's legacy one (where numpy.random is loaded: the workers seed it)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(torch.default_generator.get_state().numpy().tobytes())
    digest.update(pickle.dumps(random.getstate(), protocol=_PROTOCOL))
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        _, keys, pos, has_gauss, cached = np_random.get_state()
        digest.update(keys.tobytes())
        digest.update(struct.pack("<qqd", int(pos), int(has_gauss), float(cached)))
    return digest.digest()


class Helpers:
    """The helpers loading parts 1.. of the batch (the child's handle on them)."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.socks: list[socket.socket] = []

    @classmethod
    def start(cls, dataset: Any, parts: list[list[Any]]) -> Helpers:
        """Fork one helper per part; each waits for :meth:`go` before it loads (and exits
        at :meth:`stop`). Parts whose helper cannot be started are left to the caller
        (:meth:`take` returns None for them)."""
        helpers = cls()
        start = rng_fingerprint()
        # random reseeds itself in a forked child (os.register_at_fork): put it back there.
        seeded = random.getstate()
        me = os.getpid()
        for part in parts:
            try:
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            except OSError:
                break
            try:
                pid = os.fork()
            except OSError:
                mine.close()
                theirs.close()
                break
            if pid == 0:  # pragma: no cover - helper
                mine.close()
                for sock in helpers.socks:
                    sock.close()
                random.setstate(seeded)
                _helper(dataset, part, theirs, start, me)
            theirs.close()
            helpers.pids.append(pid)
            helpers.socks.append(mine)
        return helpers

    def go(self) -> None:
        """Let the helpers load their parts (one that is gone is left to :meth:`take`)."""
        for sock in self.socks:
            with contextlib.suppress(OSError):
                sock.send(_GO)

    def take(self, k: int) -> list[Any] | None:
        """The samples of the ``k``-th helper's part (views of its memory file); None if it
        has none, failed, or its part moved the random generators."""
        if k >= len(self.socks):
            return None
        sock = self.socks[k]
        try:
            if not select.select([sock], [], [], HELPER_WAIT_S)[0]:
                return None
            data, fds, _, _ = socket.recv_fds(sock, _MSG_BYTES, 1)
        except OSError:
            return None
        try:
            # The helper is a fork of this process: its message is this process's own data.
            msg = pickle.loads(data) if data else ()
            if not (isinstance(msg, tuple) and len(msg) == 4 and msg[0] == "part"):
                return None
            if len(fds) != 1:
                return None
            samples = unpack(fds[0], *msg[1:])
            return samples if isinstance(samples, list) else None
        except Exception:  # (the caller loads the part itself, and raises what it raises)
            return None
        finally:
            for fd in fds:
                os.close(fd)

    def stop(self) -> None:
        """Stop the helpers still running (:meth:`close` reaps them)."""
        for sock in self.socks:
            sock.close()
        self.socks = []
        for pid in self.pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        """Stop the helpers still running and reap them all."""
        self.stop()
        for pid in self.pids:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
        self.pids = []


def load_in_parts(dataset: Any, index: list[Any], count: int) -> tuple[list[Any], int, Helpers]:
    """``[dataset[i] for i in index]``, in up to ``count`` parts side by side where that gives
    the same samples (see the module); call right after seeding the batch.

    The helpers are forked first, before this process reads anything of the dataset: a file
    or an LMDB environment that reading opens would otherwise be inherited, which neither
    allows. They wait while the caller's first :data:`PACE_SAMPLES` samples decide: where
    those moved the random generators, or the batch would take under
    :data:`HEAD_SPLIT_MIN_S` at the quickest one's pace, they are stopped unused (their
    hand-over would cost more than they save: ``large``'s samples copy 588 KiB each and load
    in a fraction of a millisecond; a fork's first sample takes several times longer, hence
    the quickest of a few). Helpers that loaded at once, to be stopped after those samples,
    cost ``jpeg``'s first batch (augmentations drawn from torch's generator) 24 ms and
    ``large``'s 10 (medians of 7, 2-core VM).

    Returns the samples, how many parts were loaded side by side (1: all by the caller) and
    the helpers, for the caller to :meth:`~Helpers.close` (once the batch is sent: reaping
    them waits for their memory to be torn down).
    """
    start = rng_fingerprint()
    pace, rest = index[:PACE_SAMPLES], index[PACE_SAMPLES:]
    parts = split(rest, max(1, min(count, len(rest) // HEAD_MIN_PART)))
    helpers = Helpers.start(dataset, parts[1:])
    samples, quickest = [], float("inf")
    for i in pace:
        t0 = time.perf_counter()
        samples.append(dataset[i])
        quickest = min(quickest, time.perf_counter() - t0)
    if quickest * len(index) < HEAD_SPLIT_MIN_S or rng_fingerprint() != start:
        helpers.stop()
    else:
        helpers.go()
    samples.extend(dataset[i] for i in parts[0])
    side_by_side = 1
    for k, part in enumerate(parts[1:]):
        got = helpers.take(k) if rng_fingerprint() == start else None
        if got is None or len(got) != len(part):
            got = [dataset[i] for i in part]
        else:
            side_by_side += 1
        samples.extend(got)
    return samples, side_by_side, helpers


def _helper(
    dataset: Any, part: list[Any], sock: socket.socket, start: bytes, parent: int
) -> None:  # pragma: no cover - runs in the forked helper
    """Load ``part``, hand the samples over if the generators stand as at ``start``, exit."""
    code = 0
    try:
        die_with_parent()  # (with the process that forked it)
        # Forked from a process that may have used its OpenMP pool (the main process, for
        # num_workers="auto"'s first batch): libgomp is not fork-safe beyond one thread.
        torch.set_num_threads(1)
        if os.getppid() != parent or sock.recv(1) != _GO:  # (stopped unused: EOF)
            return
        from stoker.workers import _collate

        # The child's hand-off file is inherited: a sample that collates inside must not
        # write into it.
        _collate.install(None)
        samples = [dataset[i] for i in part]
        if rng_fingerprint() != start:
            sock.send(pickle.dumps(("moved",), protocol=_PROTOCOL))
            return
        packed = pack(samples)
        if packed is None:
            sock.send(pickle.dumps(("failed",), protocol=_PROTOCOL))
            return
        fd, place = packed
        socket.send_fds(sock, [pickle.dumps(("part", *place), protocol=_PROTOCOL)], [fd])
    except BaseException:
        code = 1
    finally:
        sock.close()
        os._exit(code)
