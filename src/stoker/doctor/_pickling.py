"""Picklability checks (SK101-SK102): what spawn and forkserver workers must receive by pickle.

Workers started by spawn or forkserver get the dataset, ``collate_fn`` and ``worker_init_fn``
pickled (torch's with the standard pickler, stoker's with cloudpickle). When pickling fails, the
object graph is walked to name the deepest attribute that cannot be pickled, e.g.
``loader.dataset.transform.transforms[1]``, and the function's definition line.
"""

from __future__ import annotations

from typing import Any

from stoker._introspect.handles import handle_kind
from stoker._introspect.pickling import (
    cloud_dumps,
    describe_object,
    locate_unpicklable,
    std_dumps,
)
from stoker.doctor._finding import Finding, Severity
from stoker.doctor._subject import Subject

__all__ = ["check_pickling", "cloud_dumps", "describe_object", "locate_unpicklable"]

# Tensors are left out of the pickle (torch sends them through shared memory, without copies).
# A dataset whose pickle is at least this large costs every spawn/forkserver worker its own copy.
LARGE_PICKLE_BYTES = 64 * 2**20


def _roots(subject: Subject) -> list[tuple[str, Any]]:
    prefix = "loader." if subject.loader is not None else ""
    roots: list[tuple[str, Any]] = [(f"{prefix}dataset" if prefix else "dataset", subject.dataset)]
    if subject.collate_fn is not None:
        roots.append((f"{prefix}collate_fn", subject.collate_fn))
    if subject.worker_init_fn is not None:
        roots.append((f"{prefix}worker_init_fn", subject.worker_init_fn))
    return roots


def check_pickling(subject: Subject, facts: dict[str, Any]) -> list[Finding]:
    """SK101 (cannot be pickled for spawn/forkserver workers), SK102 (large dataset pickle).

    Records ``dataset_pickle_bytes`` in ``facts`` when the dataset pickles.
    """
    dumps = cloud_dumps if subject.is_stoker else std_dumps
    pickler = "cloudpickle" if subject.is_stoker else "pickle"
    spawning = subject.start_method in ("spawn", "forkserver")
    findings: list[Finding] = []
    for root_path, root in _roots(subject):
        found = locate_unpicklable(root, root_path, dumps)
        if found is None:
            if root is subject.dataset:
                size = len(dumps(root))
                facts["dataset_pickle_bytes"] = size
                findings.extend(_check_pickle_size(subject, size))
            continue
        path, obj, error = found
        if subject.start_method == "fork" and handle_kind(obj) is not None:
            continue  # a handle inherited by fork: SK405 reports it, with the same fix
        if subject.has_workers and spawning:
            severity = Severity.ERROR
            when = (
                f"This loader starts its workers with {subject.start_method!r}, so the first "
                "`iter(loader)` will raise."
            )
        else:
            severity = Severity.WARNING
            when = (
                f"The start method here is {subject.start_method!r}, which does not pickle; the "
                "same code fails under spawn (macOS, Windows) and forkserver (Linux's default "
                "from Python 3.14)."
            )
        findings.append(
            Finding(
                "SK101",
                severity,
                f"`{path}` cannot be pickled for spawn/forkserver workers",
                f"`{path}` is {describe_object(obj)}; {pickler} fails with "
                f"{type(error).__name__}: {str(error)[:160]}",
                "Workers started by spawn or forkserver receive the dataset, `collate_fn` and "
                "`worker_init_fn` by pickle. Lambdas, nested functions, open files, locks, "
                f"database and HDF5 handles cannot be pickled. {when}",
                "# a module-level function (or a method) instead of a lambda/closure:\n"
                "def transform(x):\n    return ...\n\n"
                "# and open handles lazily, in the worker:\n"
                "def _handle(self):\n"
                "    if self._h is None:\n"
                "        self._h = h5py.File(self.path, 'r')\n"
                "    return self._h",
                path,
            )
        )
    return findings


def _check_pickle_size(subject: Subject, size: int) -> list[Finding]:
    if not (subject.has_workers and subject.start_method in ("spawn", "forkserver")):
        return []
    if size < LARGE_PICKLE_BYTES:
        return []
    workers = subject.num_workers or 0
    mib = size / 2**20
    return [
        Finding(
            "SK102",
            Severity.WARNING,
            "The dataset is large to pickle for every worker",
            f"the dataset pickles to {mib:,.1f} MiB; with {subject.start_method} each of the "
            f"{workers} workers receives and unpickles its own copy: {workers * mib:,.1f} MiB",
            "Every worker start (every epoch unless workers are persistent) pays the "
            "serialisation, and every worker holds a private copy of the data.",
            "# keep the data on disk or in shared arrays; hold only paths/offsets:\n"
            "self.data = np.load(path, mmap_mode='r')\n"
            "DataLoader(..., persistent_workers=True)",
            "loader.dataset" if subject.loader is not None else "dataset",
        )
    ]
