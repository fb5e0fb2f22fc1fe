"""``stoker tune``: the offline search for a fast loader configuration, written to stoker.toml."""

from stoker.tuner._tune import tune

__all__ = ["tune"]
