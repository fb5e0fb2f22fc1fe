"""Arguments of the wrong type are rejected when the loader is built, naming the value and fix.

Where torch's DataLoader raises for the same call, stoker's error is catchable as torch's type
(and torch's own value errors keep torch's words: see test_contract's constructor cases); where
torch accepts the value, to fail at iter() or never, stoker raises a ConfigError.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, get_args

import numpy as np
import pytest
import torch.utils.data as tud

import stoker
from stoker.errors import ConfigTypeError
from stoker.loader._arguments import BACKENDS
from stoker.loader._loader import Backend

DATA = list(range(8))

# case -> (kwargs, the error stoker raises, what its message names)
BAD: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "num_workers-str": ({"num_workers": "x"}, ConfigTypeError, "`num_workers` must be an int"),
    "num_workers-float": ({"num_workers": 2.5}, ConfigTypeError, "Found: 2.5 (float)"),
    "num_workers-bool": ({"num_workers": True}, ConfigTypeError, "a bool: pass 1 or 0"),
    "in_order-str": ({"in_order": "no"}, ConfigTypeError, "`in_order` must be True or False"),
    "shuffle-str": ({"shuffle": "no"}, ConfigTypeError, "any non-empty string is true"),
    "pin_memory-str": ({"pin_memory": "yes"}, ConfigTypeError, "`pin_memory`"),
    "persistent_workers-str": (
        {"num_workers": 2, "persistent_workers": "yes"},
        ConfigTypeError,
        "`persistent_workers` must be True, False or None",
    ),
    "distributed-str": ({"distributed": "yes"}, ConfigTypeError, "`distributed`"),
    "timeout-str": ({"timeout": "x"}, ConfigTypeError, "`timeout` must be a number of seconds"),
    "timeout-bool": ({"timeout": True}, ConfigTypeError, "`timeout`"),
    "timeout-nan": ({"timeout": math.nan}, stoker.ConfigError, "Found: nan"),
    "collate_fn": ({"collate_fn": 3}, ConfigTypeError, "`collate_fn` must be a function"),
    "worker_init_fn": ({"worker_init_fn": 3}, ConfigTypeError, "`worker_init_fn`"),
    "generator": ({"generator": 3}, ConfigTypeError, "`generator` must be a torch.Generator"),
    "sampler": ({"sampler": 3}, ConfigTypeError, "`sampler` must be an iterable"),
    "batch_sampler": ({"batch_sampler": 3}, ConfigTypeError, "`batch_sampler`"),
    "prefetch-str": (
        {"num_workers": 2, "prefetch_factor": "x"},
        ConfigTypeError,
        "`prefetch_factor` must be an int >= 1",
    ),
    "prefetch-float": ({"num_workers": 2, "prefetch_factor": 2.0}, ConfigTypeError, "2.0"),
    "prefetch-zero": ({"num_workers": 2, "prefetch_factor": 0}, stoker.ConfigError, "Found: 0"),
    "pin_memory_device": ({"pin_memory_device": 3}, ConfigTypeError, "`pin_memory_device`"),
    "backend-int": ({"backend": 3}, ConfigTypeError, "`backend` must be one of"),
    "backend-unknown": ({"backend": "gpu"}, stoker.ConfigError, "Found: 'gpu'"),
    "restarts-float": ({"max_worker_restarts": 1.5}, ConfigTypeError, "`max_worker_restarts`"),
    "restarts-negative": ({"max_worker_restarts": -1}, stoker.ConfigError, "Found: -1"),
    "config-int": ({"config": 3}, ConfigTypeError, "`config` must be the path"),
    "nice-float": ({"worker_nice": 2.5}, ConfigTypeError, "`worker_nice` must be an int"),
    "nice-bool": ({"worker_nice": True}, ConfigTypeError, "Found: True (bool)"),
    "nice-negative": ({"worker_nice": -5}, stoker.ConfigError, "without privileges"),
    "nice-past-19": ({"worker_nice": 20}, stoker.ConfigError, "Found: 20"),
}
# Keywords torch's DataLoader does not have.
STOKER_ONLY = {"distributed", "backend", "max_worker_restarts", "config", "worker_nice"}


def _torch_outcome(kwargs: dict[str, Any]) -> type[BaseException] | None:
    """What torch's DataLoader raises for the same call (None: it accepts it)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tud.DataLoader(DATA, **kwargs)
    except Exception as exc:
        return type(exc)
    return None


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_argument_is_rejected_at_construction(case: str) -> None:
    kwargs, error, names = BAD[case]
    with pytest.raises(error, match=names.replace("(", r"\(").replace(")", r"\)")) as info:
        stoker.DataLoader(DATA, **kwargs)
    assert isinstance(info.value, stoker.ConfigError)
    assert "Found:" in str(info.value)
    if not set(kwargs) & STOKER_ONLY:
        torch_raises = _torch_outcome(kwargs)
        if torch_raises is not None:  # code written for torch's loader still catches it
            assert isinstance(info.value, torch_raises), (torch_raises, type(info.value))


def test_torch_accepts_values_that_stoker_rejects() -> None:
    """The cases above that torch lets through: they fail at iter() or silently mislead."""
    accepted = {case for case, (kw, _, _) in BAD.items() if not set(kw) & STOKER_ONLY}
    accepted = {case for case in accepted if _torch_outcome(BAD[case][0]) is None}
    assert {"num_workers-float", "num_workers-bool", "in_order-str", "shuffle-str"} <= accepted


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_num_workers_float_fails_late_in_torch() -> None:
    loader = tud.DataLoader(DATA, num_workers=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        iter(loader)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_workers": np.int64(2)},
        {"num_workers": "auto"},
        {"timeout": np.float64(1.5)},
        {"shuffle": None},
        {"num_workers": 1, "persistent_workers": None, "prefetch_factor": "auto"},
        {"sampler": [0, 1, 2]},
        {"pin_memory_device": ""},
        {"worker_nice": np.int64(0)},
        {"worker_nice": 19},
    ],
)
def test_values_of_accepted_types_pass(kwargs: dict[str, Any]) -> None:
    loader = stoker.DataLoader(DATA, **kwargs)
    if "num_workers" in kwargs and kwargs["num_workers"] != "auto":
        assert type(loader.num_workers) is int


def test_backends_are_the_literal_of_the_loader() -> None:
    assert BACKENDS == get_args(Backend)


def test_a_type_error_is_both_a_type_error_and_a_value_error() -> None:
    for base in (TypeError, ValueError, stoker.StokerError):
        with pytest.raises(base):
            stoker.DataLoader(DATA, num_workers="x")


@pytest.mark.parametrize("value", [0, 1, np.int64(1), np.bool_(True)])
@pytest.mark.parametrize("name", ["shuffle", "pin_memory", "in_order"])
def test_flags_given_as_0_or_1_are_accepted_as_torch_accepts_them(name: str, value: Any) -> None:
    tud.DataLoader(list(range(4)), **{name: value})  # torch takes them
    stoker.DataLoader(list(range(4)), **{name: value})
