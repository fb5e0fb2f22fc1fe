"""Put/get cost of a worker's batch reply through a pipe: the typed record (as
``stoker.workers._messages.to_wire`` / ``from_wire`` send it) against the positional tuple it
replaced, in one process, alternating.

Run: ``python benchmarks/reply_wire.py [--rounds N]``. Prints microseconds per reply (median
of rounds) and the pickled size of each.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import statistics
import tempfile
import time
from typing import Any

import torch

from stoker.transport import SlotArena, encode, slot_prefix
from stoker.workers._messages import SlotBatch, from_wire, to_wire

_PROTOCOL = 5


def _reply(directory: str) -> SlotBatch:
    """A reply as a process worker sends it for a batch of 64 images and labels."""
    arena = SlotArena(slot_prefix(os.getpid(), 0), 0, 1 << 26, directory=directory)
    arena.begin()
    enc = encode((torch.zeros(64, 3, 32, 32), torch.arange(64)), arena)
    return SlotBatch(3, 1234, 1, ((1, 0.0123),), (), enc.slot, [], enc.payload, 0, [], None)


def _round(conn_out: Any, conn_in: Any, make: Any, read: Any, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        conn_out.send_bytes(pickle.dumps(make(), protocol=_PROTOCOL))
        read(pickle.loads(conn_in.recv_bytes()))
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--replies", type=int, default=5000, help="replies per round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        reply = _reply(directory)
    positional = ("D", *reply)
    variants = {
        "positional tuple (before)": (lambda: positional, lambda raw: raw[5]),
        "typed record (to_wire/from_wire)": (lambda: to_wire(reply), lambda raw: from_wire(raw)),
    }
    reader, writer = mp.Pipe(duplex=False)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (make, read) in variants.items():
            times[name].append(_round(writer, reader, make, read, args.replies))
    for name, (make, _) in variants.items():
        size = len(pickle.dumps(make(), protocol=_PROTOCOL))
        print(f"{name:34s} {statistics.median(times[name]):6.2f} us/reply, {size} bytes pickled")
    n = args.replies * 10
    t0 = time.perf_counter()
    for _ in range(n):
        from_wire(to_wire(reply))
    convert = (time.perf_counter() - t0) / n * 1e6
    print(f"{'to_wire + from_wire alone':34s} {convert:6.2f} us/reply")


if __name__ == "__main__":
    main()
