"""Every example in README.md and docs/*.md runs and prints what its page shows.

A page is run top to bottom in a fresh folder (holding a link to the repository's
``examples/``), so a later example can read what an earlier one wrote:

* a ```` ```python ```` block runs as a script in a fresh interpreter; the ```` ```output ````
  block right after it is what it must print;
* a ```` ```python file=NAME ```` block is written to NAME for the examples after it;
* a ```` ```console ```` block holds ``$ command`` lines, each followed by what it must
  print; each runs in bash with the environment's ``bin`` first on PATH and must exit 0;
* a block right after ``<!-- not run: REASON -->`` is not run (the reason is required, and
  the list of such blocks is pinned below).

Output is compared line by line after normalization: runs of spaces and of box-drawing rules
collapse, a number followed by a unit of time, rate, size, share or cores becomes ``#``
(timings vary; counts, indices and words do not), ``...`` within a line matches any text,
and a line holding only ``...`` matches any number of lines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 300
# Blocks not run, by page: each says why in its marker.
NOT_RUN = {"README.md": 2, "gpu.md": 1, "streaming.md": 1}

_FENCE = re.compile(
    r"(?:<!-- not run: (?P<why>[^>]*?) -->\n)?"
    r"^```(?P<lang>\w*)(?P<info>[^\n]*)\n(?P<body>.*?)^```$",
    re.M | re.S,
)
_UNIT = r"(?:ms|µs|s|samples/s|steps/s|MiB|GiB|KiB|MB|GB|GB/s|x|usable cores|cores)\b|%"
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?=\s?(?:" + _UNIT + "))")


@dataclass(frozen=True)
class Block:
    lang: str
    info: str
    body: str
    skip: str | None


def blocks(page: Path) -> list[Block]:
    return [
        Block(m["lang"], m["info"].strip(), m["body"], m["why"])
        for m in _FENCE.finditer(page.read_text())
    ]


def normalize(line: str) -> str:
    line = re.sub(r"[─━═]+", "─", line)
    line = _NUMBER.sub("#", line)
    return " ".join(line.split())


def matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` is what ``expected`` shows (see the module doc)."""
    pattern = []
    for line in expected.rstrip("\n").splitlines():
        if line.strip() == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
        else:
            parts = normalize(line).split("...")
            pattern.append(".*?".join(re.escape(p) for p in parts) + r"\n")
    text = "".join(normalize(line) + "\n" for line in actual.rstrip("\n").splitlines())
    return re.fullmatch("".join(pattern), text) is not None


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "PYTHONPATH")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=TIMEOUT_S)


def check_python(code: str, expected: str, where: str, cwd: Path) -> None:
    script = cwd / "example.py"
    script.write_text(code)
    done = run([sys.executable, str(script)], cwd)
    assert done.returncode == 0, f"{where} failed:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, f"{where}:\n{done.stderr[-3000:]}"
    assert matches(expected, done.stdout), (
        f"{where} printed:\n{done.stdout}\nthe page shows:\n{expected}"
    )


def check_console(body: str, where: str, cwd: Path) -> None:
    commands = re.split(r"^\$ ", body, flags=re.M)[1:]
    assert commands, f"{where}: a console block without a `$ command`"
    for item in commands:
        command, _, expected = item.partition("\n")
        done = run(["bash", "-c", command], cwd)
        assert done.returncode == 0, f"{where}: `{command}` failed:\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, f"{where}: `{command}`:\n{done.stderr[-3000:]}"
        assert matches(expected, done.stdout), (
            f"{where}: `{command}` printed:\n{done.stdout}\nthe page shows:\n{expected}"
        )


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
@pytest.mark.measures  # monitor.md's verdict comes from a real-time watch
def test_every_example_prints_what_its_page_shows(page: Path, tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    found = blocks(page)
    skipped = [b for b in found if b.skip is not None]
    assert all(b.skip for b in skipped), f"{page.name}: a `not run` marker needs a reason"
    assert len(skipped) == NOT_RUN.get(page.name, 0), f"{page.name}: blocks not run changed"
    live = [b for b in found if b.skip is None]
    for i, block in enumerate(live):
        where = f"{page.name}, example {i + 1} ({block.lang} {block.info})".strip()
        if block.lang == "python" and block.info.startswith("file="):
            (tmp_path / block.info.removeprefix("file=")).write_text(block.body)
        elif block.lang == "python":
            after = live[i + 1] if i + 1 < len(live) else None
            assert after is not None and after.lang == "output", f"{where}: no ```output after it"
            check_python(block.body, after.body, where, tmp_path)
        elif block.lang == "console":
            check_console(block.body, where, tmp_path)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_example_shows_its_output(page: Path) -> None:
    found = blocks(page)
    for i, block in enumerate(found):
        if block.lang == "python" and not block.info.startswith("file="):
            assert i + 1 < len(found) and found[i + 1].lang == "output", (
                f"{page.name}: python example {i + 1} shows no output"
            )
        if block.lang == "console":
            assert all(len(item.strip().splitlines()) > 1 for item in block.body.split("$ ")[1:]), (
                f"{page.name}: a console command shows no output"
            )


def test_the_matcher_fails_on_a_change_in_substance() -> None:
    shown = "done: 32 steps in 1.35 s | 190 samples/s | healthy\n...\nend"
    assert matches(shown, "done: 32 steps in 0.90 s | 2,513 samples/s | healthy\nx\ny\nend\n")
    assert not matches(shown, "done: 31 steps in 0.90 s | 2,513 samples/s | healthy\nend\n")
    assert not matches(shown, "done: 32 steps in 0.90 s | 2,513 samples/s | starved\nend\n")
    assert not matches("a\nb", "a\n")


def test_pages_link_each_other() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in readme, f"README.md does not link docs/{page.name}"
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+\.md)\)", page.read_text()):
            assert (page.parent / target).exists() or target in (
                "docs/differences.md",
                "docs/streaming.md",
                "differences.md",
                "streaming.md",
            ), f"{page.name} links {target}, which does not exist"
