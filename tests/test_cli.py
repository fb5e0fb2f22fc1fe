"""One convention for every `stoker` command, checked on the real console script.

Exit 0 on success, 1 when the work fails, 2 on a usage error: the subcommand's own usage and one
line naming the value on stderr, nothing on stdout, no traceback. Output cut short by a closed
pipe ends quietly. Output to a pipe is not wrapped at rich's 80 columns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.cli import _COMMANDS

ROOT = Path(__file__).resolve().parents[1]
STOKER = Path(sys.executable).with_name("stoker")
SCRIPT = ROOT / "examples" / "doctor" / "trap_shuffle_with_sampler.py"
TIMEOUT_S = 120

pytestmark = pytest.mark.skipif(not STOKER.exists(), reason="the `stoker` script is not installed")


def stoker(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [str(STOKER), *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=TIMEOUT_S,
    )


def write_log(path: Path, steps: int = 40) -> Path:
    """A small `stoker.watch` log, starved (waits as long as the steps)."""
    lines = ['{"kind":"header","schema":"stoker.watch","version":1,"every":10,"num_workers":0}']
    for i in range(steps):
        lines.append(
            f'{{"kind":"step","step":{i},"t":{i * 0.02:.6f},"wait_s":0.01,"compute_s":0.01,'
            '"size":4}'
        )
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("command", list(_COMMANDS))
def test_help_of_every_command_exits_0(command: str) -> None:
    done = stoker(command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: stoker {command}")
    assert done.stderr == ""


# (argv, text the error line must hold: the value and the argument it came from)
BAD_INPUT = {
    "bench-argparse": (["bench", "--repeats", "x"], "invalid int value: 'x'"),
    "bench-workload": (["bench", "--workload", "nope"], "unknown workload 'nope'"),
    "tune-module": (["tune", "no_such_mod_xyz:f", "-b", "8"], "`factory no_such_mod_xyz:f`"),
    "report-missing": (["report", "missing.jsonl"], "'missing.jsonl'"),
    "doctor-missing": (["doctor", "missing.py"], "'missing.py'"),
    "doctor-module": (["doctor", "no_such_mod_xyz:make"], "'no_such_mod_xyz'"),
    "env-extra": (["env", "SCRIPT"], "unrecognized arguments: SCRIPT"),
    "env-data-dir": (["env", "--data-dir", "/no/such/dir"], "`--data-dir /no/such/dir`"),
    "pack-source": (["pack", "/no/such/dir", "out"], "source '/no/such/dir' does not exist"),
    "pack-size": (["pack", "--shard-size", "12XB", ".", "out"], "not a size: '12XB'"),
    "index-missing": (["index", "/no/such/dir"], "'/no/such/dir' does not exist"),
}


def test_every_command_has_a_bad_input_case() -> None:
    assert {argv[0] for argv, _ in BAD_INPUT.values()} == set(_COMMANDS)


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_usage_error_exits_2_with_the_commands_usage_and_one_line(
    case: str, tmp_path: Path
) -> None:
    argv, value = BAD_INPUT[case]
    command = argv[0]
    done = stoker(*argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(f"usage: stoker {command} ")
    last = done.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"stoker {command}: error: ")
    assert value in last


def test_tune_names_its_own_argument_not_benchs() -> None:
    done = stoker("tune", "no_such_mod_xyz:f", "-b", "8")
    assert "--dataset" not in done.stderr and "`factory " in done.stderr


def test_an_error_line_is_not_wrapped_at_80_columns(tmp_path: Path) -> None:
    done = stoker("tune", "no_such_mod_xyz:f", "-b", "8", cwd=tmp_path)
    last = done.stderr.rstrip("\n").splitlines()[-1]
    assert len(last) > 80 and last.endswith("or install it.")


def test_no_command_is_a_usage_error() -> None:
    done = stoker()
    assert done.returncode == 2 and done.stdout == ""
    assert "name a COMMAND" in done.stderr


def pipe_to_head(*argv: str, cwd: Path = ROOT) -> tuple[int, bytes, str]:
    """`stoker ARGV | head -c 100`: stoker's status, what head printed, stoker's stderr."""
    stoker_proc = subprocess.Popen(
        [str(STOKER), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd
    )
    assert stoker_proc.stdout is not None and stoker_proc.stderr is not None
    head = subprocess.run(
        ["head", "-c", "100"], stdin=stoker_proc.stdout, capture_output=True, timeout=TIMEOUT_S
    )
    stoker_proc.stdout.close()
    err = stoker_proc.stderr.read().decode()
    return stoker_proc.wait(TIMEOUT_S), head.stdout, err


def closed_pipe(*argv: str, cwd: Path = ROOT) -> tuple[int, str]:
    """stoker writing into a pipe whose reader is already gone: every write fails (EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [str(STOKER), *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            timeout=TIMEOUT_S,
        )
    finally:
        os.close(write_end)
    return done.returncode, done.stderr


def _pipe_cases(tmp_path: Path) -> dict[str, list[str]]:
    log = write_log(tmp_path / "run.jsonl")
    return {
        "env": ["env", "--json"],
        "doctor": ["doctor", "--json", str(SCRIPT)],
        "report": ["report", "--json", str(log)],
        "bench": ["bench", "--list"],
        # no --json: what they print for a user, through the same pipe
        "tune": ["tune", "--help"],
        "pack": ["pack", "--help"],
        "index": ["index", "--help"],
    }


def test_pipe_cases_cover_every_command(tmp_path: Path) -> None:
    assert set(_pipe_cases(tmp_path)) == set(_COMMANDS)


@pytest.mark.parametrize("command", list(_COMMANDS))
def test_json_through_head_ends_quietly(command: str, tmp_path: Path) -> None:
    argv = _pipe_cases(tmp_path)[command]
    status, head, err = pipe_to_head(*argv)
    # 0 when everything fit in the pipe before head left, 1 (Python's EPIPE status) otherwise.
    assert status in (0, 1), err
    assert "Traceback" not in err and "BrokenPipeError" not in err
    assert len(head) == 100
    if "--json" in argv:
        assert head.startswith(b"{")


@pytest.mark.parametrize("argv", [["env", "--json"], ["env"], ["doctor", "--json", str(SCRIPT)]])
def test_a_closed_pipe_exits_1_without_a_traceback(argv: list[str]) -> None:
    status, err = closed_pipe(*argv)
    assert status == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception" not in err


def test_json_prints_json_only(tmp_path: Path) -> None:
    """What a factory target prints goes to stderr: stdout holds the JSON document alone."""
    (tmp_path / "noisy_target.py").write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\nprint('hello from import')\n"
        "def make():\n    print('hello from the factory')\n"
        "    return TensorDataset(torch.zeros(8, 2))\n"
    )
    done = stoker("doctor", "--json", "noisy_target:make", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    assert json.loads(done.stdout)["target"] == "noisy_target:make"
    assert "hello from import" in done.stderr and "hello from the factory" in done.stderr
    env = stoker("env", "--json")
    assert json.loads(env.stdout)["cores"]["usable"] >= 1


def test_a_table_sent_to_a_pipe_is_not_wrapped_at_80_columns(tmp_path: Path) -> None:
    log = write_log(tmp_path / "run.jsonl")
    diagnosis = json.loads(stoker("report", "--json", str(log)).stdout)["diagnosis"]
    table = stoker("report", str(log)).stdout
    rows = [line for line in table.splitlines() if diagnosis in line]
    assert len(rows) == 1 and len(rows[0]) > 80  # whole, on a row wider than 80 columns


def test_output_to_a_file_is_not_wrapped_or_padded(tmp_path: Path) -> None:
    """`stoker doctor SCRIPT > file`: each finding's sentences stay on one line, and no line
    carries the spaces a console pads to its width."""
    out = tmp_path / "doctor.txt"
    with out.open("w") as handle:
        done = subprocess.run(
            [str(STOKER), "doctor", str(SCRIPT)],
            stdout=handle,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
            timeout=TIMEOUT_S,
        )
    assert done.returncode == 1, done.stderr
    lines = out.read_text().splitlines()
    why = next(line for line in lines if line.lstrip().startswith("why"))
    assert why.rstrip().endswith("sampler."), why  # the sentence whole, on its line
    assert all(line == line.rstrip() for line in lines)
