"""Handles that must not cross a fork (SK405), and CUDA initialised before a fork (SK406).

HDF5 files, LMDB environments, SQLite connections, sockets and open files held by the dataset
when the workers fork are shared by every worker: the libraries are not fork-safe, and a
shared file offset makes concurrent reads return the wrong bytes.
"""

from __future__ import annotations

from typing import Any

from stoker._introspect.handles import handle_kind
from stoker.doctor._finding import Finding, Severity
from stoker.doctor._subject import Subject

__all__ = ["check_cuda_fork", "check_handles", "handle_kind"]

HANDLE_DEPTH = 3


def check_handles(subject: Subject) -> list[Finding]:
    """SK405: handles opened before the fork that workers would share."""
    if subject.has_workers and subject.start_method != "fork":
        return []  # spawn/forkserver pickle the dataset: SK101 reports handles there
    root = "loader.dataset" if subject.loader is not None else "dataset"
    findings: list[Finding] = []
    seen: set[int] = set()

    def walk(obj: Any, path: str, depth: int) -> None:
        if id(obj) in seen or depth > HANDLE_DEPTH:
            return
        seen.add(id(obj))
        kind = handle_kind(obj)
        if kind is not None:
            what, severity = kind.description, Severity.ERROR if kind.breaks else Severity.WARNING
            findings.append(
                Finding(
                    "SK405",
                    severity,
                    "A handle opened before the fork would be shared by the workers",
                    f"`{path}` is {what}, opened in the main process before the workers start",
                    "Forked workers inherit the same descriptor and library state: HDF5 and "
                    "LMDB are not fork-safe (corrupt reads, crashes, hangs), and a shared file "
                    "offset makes concurrent seek+read return the wrong bytes.",
                    "# open lazily, once per worker:\ndef __getitem__(self, i):\n"
                    "    if self._h is None:\n        self._h = h5py.File(self.path, 'r')\n"
                    "    return self._h['x'][i]",
                    path,
                )
            )
            return
        if isinstance(obj, dict):
            items = list(obj.items())[:64]
            for k, v in items:
                walk(v, f"{path}[{k!r}]", depth + 1)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj[:64]):
                walk(v, f"{path}[{i}]", depth + 1)
        elif isinstance(getattr(obj, "__dict__", None), dict) and not isinstance(obj, type):
            for k, v in vars(obj).items():
                walk(v, f"{path}.{k}", depth + 1)

    walk(subject.dataset, root, 0)
    return findings


def check_cuda_fork(*, cuda_initialized: bool, start_method: str, workers: int) -> list[Finding]:
    """SK406: CUDA initialised in the parent and workers started by fork."""
    if not (cuda_initialized and start_method == "fork" and workers > 0):
        return []
    return [
        Finding(
            "SK406",
            Severity.ERROR,
            "CUDA is initialised in the parent and workers are forked",
            f"torch.cuda.is_initialized() is True and {workers} workers start with fork",
            "CUDA cannot be used in a forked child ('Cannot re-initialize CUDA in forked "
            "subprocess'): any CUDA call in the dataset or collate fails in the workers.",
            "DataLoader(..., multiprocessing_context='spawn')  # or keep CUDA out of the dataset"
            "\n# and move batches to the GPU in the training loop",
            "loader.multiprocessing_context",
        )
    ]
