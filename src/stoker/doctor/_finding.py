"""What the doctor reports: a :class:`Finding` per problem, gathered in a :class:`Diagnosis`.

A finding carries a stable code (``SK001`` ...), so that CI configurations and issue reports can
refer to it, and four texts written for the user: a one-line title, what was observed (with the
numbers), why it matters, and the fix as code. The code table lives in ``doctor/README.md``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from stoker.errors import ConfigError

__all__ = ["Diagnosis", "Finding", "Severity"]

_CODE = re.compile(r"SK\d{3}")


class Severity(str, enum.Enum):
    """How bad a finding is: ``error`` breaks or will break the run, ``warning`` costs speed or
    memory, ``info`` is worth knowing."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """0 for errors, 1 for warnings, 2 for info (sort key: worst first)."""
        return _RANK[self]


_RANK = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True)
class Finding:
    """One problem found by the doctor.

    Args:
        code: stable identifier, ``SK`` followed by three digits (see ``doctor/README.md``).
        severity: ``Severity.ERROR``, ``WARNING`` or ``INFO`` (a plain string is accepted).
        title: one line naming the problem.
        observed: what was seen, with numbers (e.g. "4 workers x prefetch 2 x 38.0 MiB ...").
        why: why it matters: what breaks or slows, and when.
        fix: the fix, as code the user can paste (several lines allowed).
        location: where it was found: ``"train.py:12"`` for a script, an attribute path such as
            ``"loader.dataset.transform"`` for a live object, or ``None``.

    Raises:
        ConfigError: if ``code`` is malformed, ``severity`` unknown or a text is empty.
    """

    code: str
    severity: Severity
    title: str
    observed: str
    why: str
    fix: str
    location: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.code, str) or not _CODE.fullmatch(self.code):
            raise ConfigError(f"`code` must look like 'SK012'. Found: {self.code!r}.")
        try:
            object.__setattr__(self, "severity", Severity(self.severity))
        except ValueError:
            raise ConfigError(
                f"`severity` must be one of 'error', 'warning', 'info'. Found: {self.severity!r}."
            ) from None
        for name in ("title", "observed", "why", "fix"):
            if not str(getattr(self, name)).strip():
                raise ConfigError(f"`{name}` of finding {self.code} must not be empty.")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with the same keys as the constructor."""
        return {
            "code": self.code,
            "severity": self.severity.value,
            "title": self.title,
            "observed": self.observed,
            "why": self.why,
            "fix": self.fix,
            "location": self.location,
        }


@dataclass(frozen=True)
class Diagnosis:
    """The doctor's result: findings (worst first) and the measurements they were based on.

    Args:
        target: what was diagnosed (a script path, ``module:factory`` or an object's type).
        findings: the findings, any order (stored worst first, then by code and location).
        facts: measurements and settings the checks used (per-sample cost, batch bytes, usable
            cores, ...), as name -> JSON-ready value.
    """

    target: str
    findings: tuple[Finding, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ordered = sorted(self.findings, key=lambda f: (f.severity.rank, f.code, f.location or ""))
        object.__setattr__(self, "findings", tuple(ordered))

    @property
    def codes(self) -> list[str]:
        """The codes of the findings, worst first (a code repeats if found twice)."""
        return [f.code for f in self.findings]

    def count(self, severity: Severity | str) -> int:
        """How many findings have ``severity``."""
        sev = Severity(severity)
        return sum(1 for f in self.findings if f.severity is sev)

    def exit_status(self, *, strict: bool = False) -> int:
        """1 if an error was found (or, with ``strict``, a warning), else 0."""
        worst = {f.severity for f in self.findings}
        if Severity.ERROR in worst or (strict and Severity.WARNING in worst):
            return 1
        return 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: target, summary counts, facts and findings."""
        return {
            "target": self.target,
            "summary": {s.value: self.count(s) for s in Severity},
            "facts": dict(self.facts),
            "findings": [f.to_dict() for f in self.findings],
        }

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __len__(self) -> int:
        return len(self.findings)
