"""The finding codes' pages, for ``stoker doctor --explain CODE`` (shipped with the package).

``doctor/README.md`` shows the same table in the source tree; a test keeps the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CODES", "CodePage", "find_page", "render_index", "render_page"]

#: What a severity means, said once under every page.
SEVERITIES = (
    "An error breaks (or will break) the run; a warning costs speed, memory or portability; an "
    "info is worth knowing. Every finding says what was observed, with numbers, and where "
    "(`file.py:LINE` for scripts, an attribute path such as `loader.dataset.transform` for "
    "live objects)."
)

# Code prefix -> the family's name, as in the README's headings.
FAMILIES = {
    "SK0": "static checks of a script (read, not executed)",
    "SK1": "picklability (what spawn/forkserver workers must receive by pickle)",
    "SK2": "machine resources",
    "SK3": "memory",
    "SK4": "runtime checks of a live loader or dataset",
    "SK5": "distributed training",
}

_STATIC_LIMIT = (
    "Static checks see one file, literal values and module-level constants; a loader built in "
    "an imported module or with computed arguments is checked only as far as the values are "
    "known."
)

# Code -> what it cannot see, from the README's "Limits (known)".
LIMITS: dict[str, tuple[str, ...]] = {
    **{f"SK0{n:02d}": (_STATIC_LIMIT,) for n in range(1, 13)},
    "SK201": (
        "stoker's tests check it with a real temporary directory's statvfs standing in for a "
        "small /dev/shm.",
    ),
    "SK202": (
        "Per-rank workers that oversubscribe the node (`LOCAL_WORLD_SIZE` x `num_workers` "
        "above usable cores) are reported here.",
    ),
    "SK203": (
        "Counts thread pools that are configured (environment variables, OpenCV); BLAS/OpenMP "
        "pools left at their defaults are listed by `stoker env` but not flagged (they matter "
        "only when the dataset calls linear algebra).",
    ),
    "SK401": (
        "Samples 16 items: a tail rarer than that may be missed; a cold-cache first read that "
        "is fast on re-read is not counted as a tail.",
    ),
    "SK406": ("stoker's tests check it through its inputs (no GPU in the unit tests).",),
    "SK408": (
        "stoker's tests check it through its inputs (no notebook kernel in the unit tests).",
    ),
    "SK501": (_STATIC_LIMIT,),
    "SK502": (_STATIC_LIMIT,),
}


@dataclass(frozen=True)
class CodePage:
    """One finding code: when it fires, how severe it is, and the usual fix.

    Attributes:
        code: ``SK`` and three digits.
        severity: the severity it is reported with, and when it changes.
        checks: what it checks.
        fix: the usual fix.
    """

    code: str
    severity: str
    checks: str
    fix: str

    @property
    def family(self) -> str:
        """The family the code belongs to (its first digit)."""
        return FAMILIES[self.code[:3]]

    @property
    def limits(self) -> tuple[str, ...]:
        """What the check cannot see, if anything is known."""
        return LIMITS.get(self.code, ())


CODES: tuple[CodePage, ...] = (
    CodePage(
        "SK001",
        severity="error",
        checks=(
            'workers are started on import, outside `if __name__ == "__main__":` '
            "(module-level loop over a loader, or a module-level call of a function that "
            "builds one)"
        ),
        fix="put the entry point under the `__main__` guard",
    ),
    CodePage(
        "SK002",
        severity="warning",
        checks=(
            "a DataLoader with workers is built at module level (each spawn/forkserver worker"
            " rebuilds it)"
        ),
        fix="build it inside `main()`",
    ),
    CodePage(
        "SK003",
        severity="warning, error when the script selects spawn/forkserver",
        checks=(
            "a lambda, a nested function or a name bound to a lambda passed as `transform*`, "
            "`collate_fn`, `worker_init_fn`, or stored as `self.x = lambda ...`"
        ),
        fix="a module-level function or `functools.partial`",
    ),
    CodePage(
        "SK004",
        severity="error",
        checks="`persistent_workers=True` with `num_workers=0` (torch raises)",
        fix="give it workers or drop the flag",
    ),
    CodePage(
        "SK005",
        severity="error",
        checks="`prefetch_factor` with `num_workers=0` (torch raises)",
        fix="give it workers or drop the argument",
    ),
    CodePage(
        "SK006",
        severity="warning",
        checks="`pin_memory=True` but no copy uses `non_blocking=True`",
        fix="`x.to(device, non_blocking=True)`",
    ),
    CodePage(
        "SK007",
        severity="warning",
        checks="`non_blocking=True` copies, and no loader pins memory",
        fix="`pin_memory=torch.cuda.is_available()`",
    ),
    CodePage(
        "SK008",
        severity="warning",
        checks="`num_workers` computed from `os.cpu_count()` (host cores in containers)",
        fix='`usable_cores() - 1` or `num_workers="auto"`',
    ),
    CodePage(
        "SK009",
        severity="warning",
        checks="a literal `num_workers` above this machine's usable cores",
        fix="fewer workers",
    ),
    CodePage(
        "SK010",
        severity="warning",
        checks="a DataLoader with workers built inside a loop (new workers every epoch)",
        fix="build it once, `persistent_workers=True`",
    ),
    CodePage(
        "SK011",
        severity="warning",
        checks=(
            "a `DistributedSampler` and no `set_epoch` call in the script (silent when a "
            "`stoker.DataLoader(..., distributed=True)` calls it)"
        ),
        fix="`sampler.set_epoch(epoch)` each epoch, or `distributed=True`",
    ),
    CodePage(
        "SK012",
        severity="error",
        checks="`shuffle=True` together with `sampler=` or `batch_sampler=` (torch raises)",
        fix="shuffle in the sampler",
    ),
    CodePage(
        "SK101",
        severity="error under spawn/forkserver, warning under fork or for a bare dataset",
        checks=(
            "the dataset, `collate_fn` or `worker_init_fn` cannot be pickled (stoker's "
            "loader: cloudpickle; torch's: pickle); names the deepest attribute path and the "
            "function's definition line"
        ),
        fix="module-level functions; open handles lazily",
    ),
    CodePage(
        "SK102",
        severity="warning",
        checks=(
            "under spawn/forkserver the dataset's pickle (tensors excluded: they travel by "
            "shared memory) is >= 64 MiB, copied into every worker"
        ),
        fix="memory-map the data; keep paths/offsets only",
    ),
    CodePage(
        "SK201",
        severity="error if it does not fit, warning above half",
        checks=(
            "shm free bytes against workers x prefetch x batch bytes (x 1.25 for stoker's slots)"
        ),
        fix="`--shm-size`, lower `prefetch_factor`",
    ),
    CodePage(
        "SK202",
        severity="warning",
        checks=(
            "workers x ranks on the node (`LOCAL_WORLD_SIZE`) above usable cores (affinity "
            "and cgroup quota)"
        ),
        fix="fewer workers",
    ),
    CodePage(
        "SK203",
        severity="warning",
        checks=(
            "per-worker thread pools (thread env vars set > 1, OpenCV's pool) x workers above"
            " usable cores"
        ),
        fix="`threadpool_limits(1)`, `cv2.setNumThreads(1)` in `worker_init_fn`",
    ),
    CodePage(
        "SK204",
        severity="error if it exceeds the limit, warning above half",
        checks=(
            "torch's `file_descriptor` sharing: workers x prefetch x tensors per batch "
            "against the open-files soft limit"
        ),
        fix="`set_sharing_strategy('file_system')`, `ulimit -n`",
    ),
    CodePage(
        "SK205",
        severity="warning",
        checks="`pin_memory=True` with no accelerator",
        fix="`pin_memory=torch.cuda.is_available()`",
    ),
    CodePage(
        "SK301",
        severity="warning",
        checks=(
            "large Python containers (>= 1,000 items) held by the dataset, >= 64 MiB "
            "estimated, that each worker copies as it reads"
        ),
        fix="numpy arrays (fixed-width bytes for strings)",
    ),
    CodePage(
        "SK302",
        severity="warning",
        checks=(
            "only with `measure_memory=True` / `--memory`: a forked worker (GC frozen) gains "
            ">= 64 MiB private memory (USS) reading samples"
        ),
        fix="numpy arrays; `gc.freeze()` before forking",
    ),
    CodePage(
        "SK401",
        severity="warning",
        checks=(
            "heavy latency tail: the slowest sample (re-read to confirm, first read excluded)"
            " >= 5x the median and >= 5 ms"
        ),
        fix="`stoker.DataLoader` (dynamic dispatch), `in_order=False`",
    ),
    CodePage(
        "SK402",
        severity="error with the default collate, else warning",
        checks="samples are PIL images",
        fix="return tensors/arrays",
    ),
    CodePage(
        "SK403",
        severity="warning",
        checks="samples carry Python lists of >= 1,000 numbers",
        fix="`torch.tensor(values)`",
    ),
    CodePage(
        "SK404",
        severity="warning",
        checks="`collate_fn` >= 30% of (reading + collating) a batch",
        fix="per-sample work in `__getitem__`, collate only stacks",
    ),
    CodePage(
        "SK405",
        severity="error (h5py, LMDB, SQLite), warning (files, sockets)",
        checks="handles held by the dataset before workers fork",
        fix="open lazily in the worker",
    ),
    CodePage(
        "SK406",
        severity="error",
        checks="CUDA initialised in the parent and workers forked",
        fix="`multiprocessing_context='spawn'`",
    ),
    CodePage(
        "SK407",
        severity="error",
        checks="workers requested inside a daemonic process",
        fix="`num_workers=0` there, or a non-daemon parent",
    ),
    CodePage(
        "SK408",
        severity="error",
        checks=(
            "in Jupyter with spawn/forkserver, dataset/collate/init defined in the notebook's"
            " `__main__`"
        ),
        fix="move them to a `.py` module",
    ),
    CodePage(
        "SK409",
        severity="error",
        checks="reading or collating a sample failed",
        fix="debug with `num_workers=0`",
    ),
    CodePage(
        "SK501",
        severity="warning",
        checks=(
            "a script that calls `init_process_group`/`DistributedDataParallel` builds a "
            "DataLoader with no rank-aware sampler (every rank loads everything)"
        ),
        fix="`stoker.DataLoader(..., distributed=True)` or `DistributedSampler`",
    ),
    CodePage(
        "SK502",
        severity="error",
        checks=(
            'a distributed script uses device `"cuda"`/`"cuda:0"` and never reads '
            "`LOCAL_RANK` nor calls `set_device` (every rank on GPU 0)"
        ),
        fix='`torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`',
    ),
    CodePage(
        "SK503",
        severity="error",
        checks="runtime: the current CUDA device is not `LOCAL_RANK` (mod visible devices)",
        fix="`torch.cuda.set_device(local_rank)` before building the model",
    ),
)

_BY_CODE = {page.code: page for page in CODES}


def find_page(code: str) -> CodePage | None:
    """The page of ``code`` (case and surrounding spaces ignored), or ``None`` if unknown."""
    return _BY_CODE.get(code.strip().upper())


def render_page(page: CodePage, width: int = 100) -> str:
    """``page`` as plain text, lines wrapped at ``width``."""
    import textwrap

    def field(name: str, text: str) -> list[str]:
        return textwrap.wrap(
            text, width=width, initial_indent=f"{name:<10}", subsequent_indent=" " * 10
        )

    lines = [f"{page.code}: {page.family}", ""]
    lines += field("severity", page.severity)
    lines += field("checks", page.checks)
    lines += field("fix", page.fix)
    for limit in page.limits:
        lines += field("limits", limit)
    lines += ["", *textwrap.wrap(SEVERITIES, width=width)]
    return "\n".join(lines) + "\n"


def render_index(width: int = 100) -> str:
    """Every code, one entry each: code, severity and what it checks."""
    import textwrap

    lines: list[str] = []
    family = ""
    for page in CODES:
        if page.family != family:
            family = page.family
            lines += [*([""] if lines else []), f"{page.code[:3]}xx: {family}"]
        lines += textwrap.wrap(
            f"{page.severity}: {page.checks}",
            width=width,
            initial_indent=f"  {page.code}  ",
            subsequent_indent=" " * 9,
        )
    lines += ["", "`stoker doctor --explain CODE` shows one code's page."]
    return "\n".join(lines) + "\n"
