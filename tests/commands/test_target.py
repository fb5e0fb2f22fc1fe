"""A command's `module:factory` is imported from the current directory, which leaves `sys.path`
once it is: a file in a downloaded dataset folder named like a module imported later (here
`h5py.py`) must not run in its place, in the command's process or in its spawn workers.

Each check runs in a fresh interpreter: `h5py` imported by an earlier test would hide an import
taken from the folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stoker._commands.target import call_factory, import_factory
from stoker.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

TARGET = textwrap.dedent(
    """
    import sys
    import planted_helper  # a sibling: the target's own imports see the folder

    class Data:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i

    def make():
        return Data()

    def where(queue):
        '''In a worker: where the target and the next imports come from.'''
        import importlib.util
        import h5py
        queue.put({
            "target": __file__,
            "fake_h5py": getattr(h5py, "PLANTED", False),
            "probe": importlib.util.find_spec("stoker_planted_probe") is not None,
        })
    """
)

# Checks made after the target is loaded, in the process that loaded it and in a spawn worker.
AFTER_LOAD = textwrap.dedent(
    """
    import importlib.util, json, multiprocessing, sys
    {load}
    import h5py
    import planted_target
    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    worker = spawn.Process(target=planted_target.where, args=(queue,))
    worker.start()
    child = queue.get(timeout=60)
    worker.join(60)
    print(json.dumps({{
        "fake_h5py": getattr(h5py, "PLANTED", False),
        "probe": importlib.util.find_spec("stoker_planted_probe") is not None,
        "child": child,
    }}))
    """
)

LOADERS = {
    "bench": "from stoker.bench._cli import load_factory; load_factory('planted_target:make')",
    "tune": "from stoker.bench._cli import load_factory; load_factory('planted_target:make', "
    "'factory')",
    "doctor": "from stoker.cli import main; assert main(['doctor', '--json', "
    "'planted_target:make']) in (0, 1)",
}


@pytest.fixture
def dataset_folder(tmp_path: Path) -> Path:
    """A folder holding the target, a sibling it imports, and two planted modules."""
    (tmp_path / "planted_target.py").write_text(TARGET)
    (tmp_path / "planted_helper.py").write_text("VALUE = 1\n")
    (tmp_path / "h5py.py").write_text("PLANTED = True\n")
    (tmp_path / "stoker_planted_probe.py").write_text("PLANTED = True\n")
    return tmp_path


@pytest.mark.parametrize("command", list(LOADERS))
def test_modules_planted_in_the_folder_are_not_imported_after_the_target(
    command: str, dataset_folder: Path
) -> None:
    pytest.importorskip("h5py")
    code = AFTER_LOAD.format(load=LOADERS[command])
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=dataset_folder,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["fake_h5py"] is False and seen["probe"] is False
    child = seen["child"]
    # The spawn worker found the target (by name, as unpickling does) and nothing else there.
    assert Path(child["target"]).resolve() == (dataset_folder / "planted_target.py").resolve()
    assert child["fake_h5py"] is False and child["probe"] is False


def test_without_the_fix_the_planted_module_would_win(dataset_folder: Path) -> None:
    """The folder first on sys.path, as the import needs it, does shadow h5py: what the test
    above guards against is real."""
    pytest.importorskip("h5py")
    code = "import sys; sys.path.insert(0, ''); import h5py; print(getattr(h5py, 'PLANTED', 0))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=dataset_folder
    )
    assert done.stdout.strip() == "True"


def test_import_errors_name_the_argument(
    dataset_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(dataset_folder)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (dataset_folder / "raising_target.py").write_text("x = 1\nraise ValueError('no data here')\n")
    with pytest.raises(
        ConfigError, match=r"`factory` must look like `module:factory`.*Found: .nope."
    ):
        import_factory("nope", "factory")
    with pytest.raises(ConfigError, match=r"raised ValueError: no data here \(at .*:2\)"):
        import_factory("raising_target:make", "--dataset")
    sys.modules.pop("raising_target", None)


def test_a_factory_that_raises_is_one_line_naming_where() -> None:
    def make() -> None:
        raise OSError("disk\ngone")

    with pytest.raises(ConfigError, match=r"raised OSError: disk gone \(at .*test_target.py:\d+\)"):
        call_factory(make, "mod:make")
