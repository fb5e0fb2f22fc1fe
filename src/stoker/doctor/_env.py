"""``stoker env``: what this machine offers data loading, and a reproducible environment file.

:func:`collect_env` gathers the facts (Python, torch build, accelerators and driver, usable
cores, memory, shared memory, open-files limit, start method, thread variables, the
environment manager, the filesystem of a data directory); :func:`export_environment` writes
``environment.yml``: conda's own export where conda is active, otherwise a file with a ``pip``
section pinned to the installed distributions.
"""

# The runtime subject is imported only for the start-method fact (start-up of `stoker env`).

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from stoker._introspect import platform as _platform

__all__ = ["collect_env", "environment_manager", "export_environment", "pip_environment_yaml"]

Manager = Literal["conda", "venv", "system"]
# How long `conda env export` may take before the pip-pinned file is written instead.
CONDA_EXPORT_TIMEOUT_S = 120.0
_NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")
# Not pinned in the pip section: the installer itself.
_SKIP_DISTS = frozenset({"pip"})


def environment_manager(
    environ: dict[str, str] | None = None, prefix: str | None = None
) -> tuple[Manager, str | None]:
    """Which environment manager this interpreter runs in, and its name or path.

    conda is recognised by ``CONDA_PREFIX`` matching the interpreter's prefix, or by a
    ``conda-meta`` directory in the prefix; a venv by ``sys.prefix != sys.base_prefix``.

    Args:
        environ: environment variables. Default: ``os.environ``.
        prefix: the interpreter's prefix. Default: ``sys.prefix``.
    """
    env = os.environ if environ is None else environ
    prefix = sys.prefix if prefix is None else prefix
    conda_prefix = env.get("CONDA_PREFIX")
    same = conda_prefix is not None and os.path.realpath(conda_prefix) == os.path.realpath(prefix)
    if same or (Path(prefix) / "conda-meta").is_dir():
        return "conda", env.get("CONDA_DEFAULT_ENV") or prefix
    if prefix != sys.base_prefix:
        return "venv", prefix
    return "system", None


def _accelerators() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"cuda_available": torch.cuda.is_available(), "devices": []}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            info["devices"].append(
                {"index": i, "name": props.name, "memory_bytes": int(props.total_memory)}
            )
    mps = getattr(torch.backends, "mps", None)
    info["mps_available"] = bool(mps is not None and mps.is_available())
    try:
        text = _NVIDIA_DRIVER.read_text()
        found = re.search(r"Kernel Module\s+([\d.]+)", text)
        info["nvidia_driver"] = found.group(1) if found else text.splitlines()[0]
    except OSError:
        info["nvidia_driver"] = None
    return info


def _thread_pools() -> list[dict[str, Any]]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [
        {
            "api": i.get("user_api"),
            "library": i.get("internal_api"),
            "threads": i.get("num_threads"),
        }
        for i in threadpool_info()
    ]


def collect_env(data_dir: str | None = None) -> dict[str, Any]:
    """Facts about this machine and interpreter that matter for data loading.

    Args:
        data_dir: a directory whose filesystem type to report (local disk, NFS, tmpfs...).
            Default: none.

    Returns:
        A JSON-ready dict.
    """
    import psutil
    import torch
    import torch.multiprocessing

    from stoker.doctor._subject import default_start_method

    soft, hard = _platform.open_files_limit()
    vm = psutil.virtual_memory()
    shm = _platform.shm_dir()
    manager, env_name = environment_manager()
    cuda = torch.version.cuda
    hip = getattr(torch.version, "hip", None)
    facts: dict[str, Any] = {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "platform": platform.platform(),
        "torch": {
            "version": torch.__version__,
            "build": f"CUDA {cuda}" if cuda else f"ROCm {hip}" if hip else "CPU",
            "num_threads": torch.get_num_threads(),
            "sharing_strategy": torch.multiprocessing.get_sharing_strategy(),
        },
        "accelerators": _accelerators(),
        "cores": {
            "os_cpu_count": os.cpu_count(),
            "affinity": _platform.affinity_cores(),
            "cgroup_quota": _platform.cgroup_cpu_quota(),
            "usable": _platform.usable_cores(),
        },
        "memory": {
            "total_bytes": int(vm.total),
            "available_bytes": int(vm.available),
            "cgroup_limit_bytes": _platform.cgroup_memory_limit(),
        },
        "shm": {
            "dir": shm,
            "total_bytes": _platform.shm_total_bytes(shm),
            "free_bytes": _platform.shm_free_bytes(shm),
            # Where stoker's workers put the batches the shm directory has no room for.
            "spill_dir": tempfile.gettempdir(),
            "spill_free_bytes": _platform.shm_free_bytes(tempfile.gettempdir()),
        },
        "open_files": {"soft": soft, "hard": hard},
        "start_method": default_start_method(),
        "thread_env": _platform.thread_env_vars(),
        "thread_pools": _thread_pools(),
        "environment": {"manager": manager, "name": env_name},
    }
    if data_dir is not None:
        fstype = _platform.fs_type(data_dir)
        facts["data_dir"] = {
            "path": str(Path(data_dir).resolve()),
            "exists": Path(data_dir).exists(),
            "fs_type": fstype,
            "kind": _platform.fs_kind(fstype),
        }
    return facts


def _requirement(dist: importlib.metadata.Distribution) -> str | None:
    name = dist.metadata["Name"]
    if not name or name.lower() in _SKIP_DISTS:
        return None
    direct = dist.read_text("direct_url.json")
    if direct:
        try:
            url = json.loads(direct)
        except ValueError:
            url = {}
        if url.get("dir_info", {}).get("editable") or url.get("url", "").startswith("file:"):
            return f"# {name}=={dist.version} is installed from a local path: {url.get('url')}"
    return f"{name}=={dist.version}"


def pip_environment_yaml(name: str | None = None) -> str:
    """An ``environment.yml`` with Python and every installed distribution pinned under pip.

    torch wheels with a local version (``2.3.0+cpu``, ``+cu121``) get the matching PyTorch
    index as ``--extra-index-url`` so that the pin resolves.
    """
    prefix = Path(sys.prefix)
    default = prefix.parent.name if prefix.name.startswith(".") else prefix.name
    env_name = name or default or "stoker-env"
    reqs: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        req = _requirement(dist)
        if req is not None:
            reqs.setdefault(re.sub(r"[-_.]+", "-", str(dist.metadata["Name"]).lower()), req)
    lines = [
        f"# written by `stoker env --export` from {sys.executable}",
        f"name: {env_name}",
        "channels:",
        "  - conda-forge",
        "dependencies:",
        f"  - python={platform.python_version()}",
        "  - pip",
        "  - pip:",
    ]
    torch_version = next((r for k, r in reqs.items() if k == "torch"), "")
    local = torch_version.partition("+")[2]
    if local:
        lines.append(f"    - --extra-index-url https://download.pytorch.org/whl/{local}")
    for key in sorted(reqs):
        req = reqs[key]
        lines.append(f"    {req}" if req.startswith("#") else f"    - {req}")
    return "\n".join(lines) + "\n"


def export_environment(path: str | Path) -> str:
    """Write a reproducible environment file to ``path``; return how it was made.

    With conda active, ``conda env export`` writes it (its own format, including pip
    packages); otherwise (or if conda fails) :func:`pip_environment_yaml` does.

    Returns:
        ``"conda env export"`` or ``"pip pins"``.

    Raises:
        OSError: if ``path`` cannot be written.
    """
    target = Path(path)
    manager, _ = environment_manager()
    if manager == "conda":
        conda = os.environ.get("CONDA_EXE") or shutil.which("conda")
        if conda:
            try:
                done = subprocess.run(
                    [conda, "env", "export", "--prefix", sys.prefix],
                    capture_output=True,
                    text=True,
                    timeout=CONDA_EXPORT_TIMEOUT_S,
                    check=True,
                )
                target.write_text(done.stdout, encoding="utf-8")
                return "conda env export"
            except (OSError, subprocess.SubprocessError):
                pass
    target.write_text(pip_environment_yaml(), encoding="utf-8")
    return "pip pins"
