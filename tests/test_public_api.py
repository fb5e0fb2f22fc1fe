"""The public surface is exactly what `stoker.__all__` names, and it is documented."""

from __future__ import annotations

import inspect
import subprocess
import sys

import torch

import stoker

PUBLIC = {
    "ConfigError",
    "DataLoader",
    "Failure",
    "FailureLimitError",
    "HDF5Dataset",
    "LMDBDataset",
    "LoaderStats",
    "MainGuardError",
    "RankSampler",
    "ShardDataset",
    "SharedMemoryError",
    "StokerError",
    "UnpicklableError",
    "World",
    "WorkerError",
    "WorkerStats",
    "WorkerTimeoutError",
    "__version__",
    "compact",
    "diagnose",
    "tune",
    "watch",
}


def test_all_is_exactly_the_public_surface_and_sorted():
    assert set(stoker.__all__) == PUBLIC
    assert list(stoker.__all__) == sorted(stoker.__all__)
    for name in stoker.__all__:  # lazy ones resolve
        assert getattr(stoker, name) is not None
    exported = {n for n in vars(stoker) if not n.startswith("_")}
    modules = {m for m in exported if inspect.ismodule(getattr(stoker, m))}
    assert exported - modules - {"annotations", "importlib", "TYPE_CHECKING", "Any"} <= PUBLIC


def test_import_stays_light():
    code = (
        "import sys, stoker; heavy = [m for m in ('stoker.monitor', 'stoker.doctor', "
        "'stoker.shards', 'stoker.tuner._tune', 'rich', 'matplotlib', 'PIL') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_public_object_has_a_docstring():
    for name in stoker.__all__:
        obj = getattr(stoker, name)
        if not isinstance(obj, str):
            assert inspect.getdoc(obj), name


def test_dataloader_is_a_torch_dataloader_with_the_same_positional_signature():
    ours = inspect.signature(stoker.DataLoader.__init__).parameters
    theirs = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    for name, param in theirs.items():
        assert name in ours, name
        assert ours[name].kind == param.kind, name
        if name != "persistent_workers":  # None: persistent whenever num_workers > 0
            assert ours[name].default == param.default, name
    assert issubclass(stoker.DataLoader, torch.utils.data.DataLoader)


def test_errors_share_one_root():
    for name in ("ConfigError", "SharedMemoryError", "WorkerError", "WorkerTimeoutError"):
        assert issubclass(getattr(stoker, name), stoker.StokerError)
    assert issubclass(stoker.ConfigError, ValueError)
    assert issubclass(stoker.WorkerTimeoutError, RuntimeError)


def test_command_line_help_lists_subcommands():
    out = subprocess.run(
        [sys.executable, "-m", "stoker", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "bench" in out
