"""``stoker doctor``: find what slows or breaks data loading, and say how to fix it.

Two entry points::

    diagnose(loader_or_dataset_or_factory)  # runtime checks on live objects (SK1xx-SK4xx)
    diagnose_script("train.py")             # static checks of a script, no execution (SK0xx)

Both return a :class:`Diagnosis`: findings with a stable code, a severity, what was observed
(with numbers), why it matters and the fix as code. The codes are listed in README.md here.
"""

from __future__ import annotations

from stoker.doctor._diagnose import diagnose
from stoker.doctor._finding import Diagnosis, Finding, Severity
from stoker.doctor._static import diagnose_script

__all__ = ["Diagnosis", "Finding", "Severity", "diagnose", "diagnose_script"]
