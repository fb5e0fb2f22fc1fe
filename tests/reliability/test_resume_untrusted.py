"""A resume state is untrusted input: ``load_state_dict`` checks it whole first (issue 25).

A corrupted or foreign state (wrong types, negative or too large numbers, a huge prefix,
unknown, missing or nested garbage keys, a state saved over a dataset of another length) is a
``ConfigError`` that names the key, the value found and the fix, and the loader is left as it
was: it iterates as one that was never given the state. Hypothesis fuzzes random mutations of
valid saved states and random JSON-ish structures: each input either loads, and the resumed
epoch yields exactly the batches the state says are left, or is a ``ConfigError``; never
another exception, a hang, or an allocation that grows with a number in the input.
"""

from __future__ import annotations

import copy
import io
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.utils.data as tud
from _faulty import RandomDataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stoker
from stoker.errors import ConfigError
from stoker.sampling import RankSampler, World
from stoker.sampling._resume import UNSIZED_BATCHES_LIMIT, EpochState

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

N = 30
BATCH = 4  # 8 batches per epoch, the last one of 2 samples
BATCHES = 8
SEED = 11
FIX = "pass the state saved by the same loader"
# What loading a state may allocate (tracemalloc peak): the state's own size, not its numbers.
LOAD_PEAK_BYTES = 1 << 20

Batch = tuple[tuple[int, int], ...]
Mutation = Callable[[dict[str, Any]], Any]

S = EpochState  # the saved keys are its class constants
R = RankSampler


def _loader(workers: int = 0, n: int = N, kind: str = "shuffle") -> stoker.DataLoader:
    """``kind``: ``"shuffle"`` (torch's RandomSampler, from the ``generator``) or ``"rank"``
    (a :class:`RankSampler`, whose state travels inside the loader's)."""
    extra: dict[str, Any] = {"multiprocessing_context": "fork"} if workers else {}
    if kind == "rank":
        extra["sampler"] = RankSampler(n, seed=SEED, world=World())
    else:
        extra["shuffle"] = True
    return stoker.DataLoader(
        RandomDataset(n),
        batch_size=BATCH,
        num_workers=workers,
        generator=torch.Generator().manual_seed(SEED),
        **extra,
    )


def _rows(batch: Any) -> Batch:
    return tuple(zip(batch[0].tolist(), batch[1].tolist(), strict=True))


def _epoch(loader: stoker.DataLoader) -> list[Batch]:
    return [_rows(b) for b in loader]


def _round_trip(state: Any) -> Any:
    """Through ``torch.save`` bytes, as a checkpoint would."""
    buf = io.BytesIO()
    torch.save({"loader": state}, buf)
    return torch.load(io.BytesIO(buf.getvalue()), weights_only=False)["loader"]


def _saved(taken: int = 3, kind: str = "shuffle", n: int = N) -> dict[str, Any]:
    """The state of a loader that delivered ``taken`` batches of its first epoch."""
    loader = _loader(kind=kind, n=n)
    it = iter(loader)
    for _ in range(taken):
        next(it)
    return _round_trip(loader.state_dict())


_FRESH: dict[str, list[Batch]] = {}


def _fresh(kind: str = "shuffle") -> list[Batch]:
    """The first epoch of a loader that was given no state."""
    if kind not in _FRESH:
        _FRESH[kind] = _epoch(_loader(kind=kind))
    return _FRESH[kind]


def _delivered(state: dict[str, Any]) -> set[int]:
    saved = state[S.KEY_DELIVERED]
    return set(range(saved[S.KEY_PREFIX])) | set(saved[S.KEY_REST])


def _rejects(loader: stoker.DataLoader, state: Any) -> str:
    """``loader.load_state_dict(state)`` raises ConfigError (its message is returned) and
    allocates no more than :data:`LOAD_PEAK_BYTES` doing so."""
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as caught:
            loader.load_state_dict(state)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < LOAD_PEAK_BYTES, f"rejecting the state allocated {peak} bytes"
    return str(caught.value)


# -- the corrupted cases ---------------------------------------------------------------------


def _set(*path: Any, value: Any) -> Mutation:
    def mutate(state: dict[str, Any]) -> None:
        for key in path[:-1]:
            state = state[key]
        state[path[-1]] = value

    return mutate


def _drop(key: str) -> Mutation:
    return lambda state: state.pop(key)


D, P, RE = S.KEY_DELIVERED, S.KEY_PREFIX, S.KEY_REST
CASES: list[tuple[str, Mutation, str]] = [
    # wrong types
    ("epoch-string", _set(S.KEY_EPOCH, value="3"), "['epoch']"),
    ("epoch-float", _set(S.KEY_EPOCH, value=1.0), "['epoch']"),
    ("epoch-bool", _set(S.KEY_EPOCH, value=True), "['epoch']"),
    ("finished-int", _set(S.KEY_FINISHED, value=1), "['finished']"),
    ("version-bool", _set(S.KEY_VERSION, value=True), "version True"),
    ("version-other", _set(S.KEY_VERSION, value=2), "version 2"),
    ("rng-string", _set(S.KEY_RNG, value="x"), "['rng']"),
    ("rng-float-tensor", _set(S.KEY_RNG, value=torch.zeros(5056)), "['rng']"),
    ("rng-wrong-size", _set(S.KEY_RNG, value=torch.zeros(3, dtype=torch.uint8)), "['rng']"),
    ("rng-invalid-bytes", _set(S.KEY_RNG, value=torch.zeros(5056, dtype=torch.uint8)), "['rng']"),
    ("base-seed-string", _set(S.KEY_BASE_SEED, value="7"), "['base_seed']"),
    ("workers-float", _set(S.KEY_WORKERS, value=2.0), "['workers']"),
    ("delivered-list", _set(D, value=[0, 1, 2]), "['delivered']"),
    ("prefix-string", _set(D, P, value="3"), "['delivered']['prefix']"),
    ("rest-not-list", _set(D, RE, value="0123"), "['delivered']['rest']"),
    ("rest-float", _set(D, RE, value=[4.0]), "['delivered']['rest'][0]"),
    ("rest-bool", _set(D, RE, value=[True]), "['delivered']['rest'][0]"),
    ("worker-states-list", _set(S.KEY_WORKER_STATES, value=[{}]), "['worker_states']"),
    ("worker-states-str-key", _set(S.KEY_WORKER_STATES, value={"0": {}}), "['worker_states']"),
    # negative
    ("epoch-negative", _set(S.KEY_EPOCH, value=-1), "['epoch']"),
    ("iter-epoch-negative", _set(S.KEY_ITER_EPOCH, value=-1), "['iter_epoch']"),
    ("base-seed-negative", _set(S.KEY_BASE_SEED, value=-1), "['base_seed']"),
    ("workers-negative", _set(S.KEY_WORKERS, value=-2), "['workers']"),
    ("prefix-negative", _set(D, P, value=-1), "['delivered']['prefix']"),
    ("rest-negative", _set(D, RE, value=[-1]), "['delivered']['rest'][0]"),
    # too large
    ("prefix-past-the-epoch", _set(D, P, value=BATCHES + 1), "['delivered']['prefix']"),
    ("rest-past-the-epoch", _set(D, RE, value=[5, BATCHES]), "['delivered']['rest'][1]"),
    ("rest-longer-than-the-epoch", _set(D, RE, value=[5] * 100), "['delivered']['rest']"),
    ("worker-id-past-the-workers", _set(S.KEY_WORKER_STATES, value={3: {}}), "['worker_states']"),
    ("epoch-huge", _set(S.KEY_EPOCH, value=10**30), "['epoch']"),
    ("base-seed-past-int64", _set(S.KEY_BASE_SEED, value=2**64), "['base_seed']"),
    # huge prefix: no allocation proportional to it
    ("prefix-10**12", _set(D, P, value=10**12), "['delivered']['prefix']"),
    ("prefix-10**5000", _set(D, P, value=10**5000), "['delivered']['prefix']"),
    # unknown keys
    ("unknown-key", _set("bogus", value=1), "'bogus'"),
    ("unknown-non-string-key", _set(7, value=1), "[7]"),
    ("unknown-delivered-key", _set(D, "gaps", value=[]), "['delivered']"),
    # missing keys
    ("missing-epoch", _drop(S.KEY_EPOCH), "['epoch']"),
    ("missing-rng", _drop(S.KEY_RNG), "['rng']"),
    ("missing-delivered", _drop(S.KEY_DELIVERED), "['delivered']"),
    ("missing-finished", _drop(S.KEY_FINISHED), "['finished']"),
    ("missing-version", _drop(S.KEY_VERSION), "['version']"),
    ("missing-rest", lambda s: s[D].pop(RE), "['rest']"),
    # nested garbage
    ("nested-prefix", _set(D, P, value={"a": [1, {2}]}), "['delivered']['prefix']"),
    ("nested-rest", _set(D, RE, value=[[[[[0]]]]]), "['delivered']['rest'][0]"),
    ("nested-epoch", _set(S.KEY_EPOCH, value=[[1, 2], {"x": None}]), "['epoch']"),
    ("sampler-state-without-a-sampler-to-take-it", _set(S.KEY_SAMPLER, value={"x": 1}), "sampler"),
    ("long-string", _set(S.KEY_EPOCH, value="x" * 10**6), "['epoch']"),
]


@pytest.mark.parametrize(("mutate", "names"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_corrupted_state_is_a_config_error_and_the_loader_is_unchanged(
    mutate: Mutation, names: str
) -> None:
    state = _saved()
    mutate(state)
    loader = _loader()
    message = _rejects(loader, state)
    assert names in message, message
    assert len(message) < 600, "the value found must be shown truncated"
    assert _epoch(loader) == _fresh()


@pytest.mark.parametrize("state", [None, [], "state", 42, b"\x80", torch.zeros(3)])
def test_a_state_that_is_not_a_dictionary_is_a_config_error(state: Any) -> None:
    loader = _loader()
    assert "stoker.DataLoader.state_dict()" in _rejects(loader, state)
    assert _epoch(loader) == _fresh()


def test_the_message_names_the_key_the_value_found_and_the_fix() -> None:
    state = _saved()
    state[D][P] = 10**12
    message = _rejects(_loader(), state)
    assert message.startswith(
        "`state_dict['delivered']['prefix']` must be an int in [0, 8]: the batches in an epoch "
        "of this loader. Found: 1000000000000."
    ), message
    assert FIX in message
    state[D][P] = 10**5000  # its repr would exceed Python's int-to-str digit limit
    assert "Found: <int of 16610 bits>" in _rejects(_loader(), state)


@pytest.mark.parametrize(("saved_over", "loaded_into"), [(20, N), (40, N), (N, 20)])
def test_a_state_from_a_dataset_of_another_length_is_a_config_error(
    saved_over: int, loaded_into: int
) -> None:
    """Even when its delivered batches would fit the other epoch (one was delivered)."""
    state = _saved(taken=1, n=saved_over)
    loader = _loader(n=loaded_into)
    message = _rejects(loader, state)
    assert f"saved over a dataset of {saved_over} samples" in message, message
    assert f"has {loaded_into} samples" in message
    if loaded_into == N:
        assert _epoch(loader) == _fresh()


def test_a_state_without_the_length_key_still_resumes_exactly() -> None:
    """States written before the dataset's length was saved stay readable."""
    state = _saved()
    del state[S.KEY_LENGTH]
    loader = _loader()
    loader.load_state_dict(state)
    assert _epoch(loader) == _fresh()[3:]


def test_a_rejected_state_leaves_a_state_loaded_before_in_place() -> None:
    good = _saved(taken=5)
    loader = _loader()
    loader.load_state_dict(good)
    bad = copy.deepcopy(good)
    bad[D][RE] = ["x"]
    _rejects(loader, bad)
    assert _round_trip(loader.state_dict())[D] == good[D]
    assert _epoch(loader) == _fresh()[5:]


class Stream(tud.IterableDataset[int]):
    """No length: the number of batches in an epoch is unknown."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(10))


def test_an_unsized_loader_bounds_the_delivered_batches_by_a_constant() -> None:
    loader = stoker.DataLoader(Stream(), batch_size=2)
    state = _round_trip(loader.state_dict())
    assert state[S.KEY_LENGTH] is None
    for prefix in (10**12, UNSIZED_BATCHES_LIMIT + 1):
        state[D][P] = prefix
        message = _rejects(loader, state)
        assert "a loader whose epoch has no length" in message, message
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


# -- the sampler's own state -----------------------------------------------------------------

SAMPLER_CASES: list[tuple[str, Mutation, str]] = [
    ("remaining-huge-range", _set(R.KEY_REMAINING, value=[[0, 10**12]]), "['remaining'][0][1]"),
    ("remaining-string", _set(R.KEY_REMAINING, value="ab"), "['remaining']"),
    ("remaining-negative", _set(R.KEY_REMAINING, value=[[-5, 3]]), "['remaining'][0][0]"),
    ("remaining-overlap", _set(R.KEY_REMAINING, value=[[0, 5], [3, 8]]), "['remaining'][1][0]"),
    ("remaining-empty-range", _set(R.KEY_REMAINING, value=[[4, 4]]), "['remaining'][0][1]"),
    ("remaining-triple", _set(R.KEY_REMAINING, value=[[0, 4, 8]]), "['remaining'][0]"),
    ("remaining-too-many", _set(R.KEY_REMAINING, value=[[0, 1]] * (N + 1)), "['remaining']"),
    ("world-size-zero", _set(R.KEY_WORLD_SIZE, value=0), "['world_size']"),
    ("world-size-huge", _set(R.KEY_WORLD_SIZE, value=10**9), "['world_size']"),
    ("world-size-string", _set(R.KEY_WORLD_SIZE, value="2"), "['world_size']"),
    ("consumed-negative", _set(R.KEY_CONSUMED, value=-3), "['consumed']"),
    ("epoch-negative", _set(R.KEY_EPOCH, value=-1), "['epoch']"),
    ("seed-bool", _set(R.KEY_SEED, value=True), "['seed']"),
    ("shuffle-int", _set(R.KEY_SHUFFLE, value=1), "['shuffle']"),
    ("length-other", _set(R.KEY_LENGTH, value=N + 1), f"length saved {N + 1}, now {N}"),
    ("version-other", _set(R.KEY_VERSION, value=9), "version 9"),
    ("unknown-key", _set("zzz", value=1), "'zzz'"),
    ("missing-shuffle", _drop(R.KEY_SHUFFLE), "['shuffle']"),
]


@pytest.mark.parametrize(
    ("mutate", "names"), [c[1:] for c in SAMPLER_CASES], ids=[c[0] for c in SAMPLER_CASES]
)
def test_a_corrupted_sampler_state_is_a_config_error_from_sampler_and_loader(
    mutate: Mutation, names: str
) -> None:
    """Directly, and nested in a loader's state (found at ``load_state_dict``, not at the
    next ``iter()``, after the loader had restored its random state)."""
    state = RankSampler(N, seed=SEED, world=World()).state_dict()
    mutate(state)
    sampler = RankSampler(N, seed=SEED, world=World())
    with pytest.raises(ConfigError) as caught:
        sampler.load_state_dict(state)
    assert names in str(caught.value), str(caught.value)
    assert list(sampler) == list(RankSampler(N, seed=SEED, world=World()))

    saved = _saved(kind="rank")
    saved[S.KEY_SAMPLER] = state
    loader = _loader(kind="rank")
    message = _rejects(loader, saved)
    assert names in message and "sampler" in message, message
    assert _epoch(loader) == _fresh("rank")


def test_a_rank_sampler_state_resumes_exactly_through_the_loader() -> None:
    state = _saved(taken=2, kind="rank")
    loader = _loader(kind="rank")
    loader.load_state_dict(state)
    assert _epoch(loader) == _fresh("rank")[2:]


# -- with workers ----------------------------------------------------------------------------


def test_a_loader_with_warm_workers_rejects_a_bad_state_and_resumes_a_good_one() -> None:
    uninterrupted = _loader(workers=2)
    reference = [_epoch(uninterrupted) for _ in range(3)]
    del uninterrupted
    loader = _loader(workers=2)
    assert _epoch(loader) == reference[0]  # its persistent workers are up
    bad = _saved(taken=3)
    bad[D][P] = 10**12
    _rejects(loader, bad)
    bad[S.KEY_BASE_SEED] = "1"
    bad[D][P] = 2
    _rejects(loader, bad)
    assert _epoch(loader) == reference[1]  # as if nothing had been loaded
    it = iter(loader)
    got = [_rows(next(it)) for _ in range(3)]
    good = _round_trip(loader.state_dict())
    del it
    resumed = _loader(workers=2)
    resumed.load_state_dict(good)
    assert got + _epoch(resumed) == reference[2]
    del loader, resumed


def test_the_largest_valid_numbers_load_and_iterate_with_workers() -> None:
    state = _saved(taken=1)
    state[S.KEY_BASE_SEED] = 2**63 - 1
    state[S.KEY_EPOCH] = state[S.KEY_ITER_EPOCH] = 2**48
    state[S.KEY_WORKERS] = 2**48
    rests = []
    for workers in (2, 0):
        loader = _loader(workers=workers)
        loader.load_state_dict(state)
        rests.append(_epoch(loader))
        del loader
    assert len(rests[0]) == BATCHES - 1
    assert rests[0] == rests[1]


# -- fuzz ------------------------------------------------------------------------------------


def _load_or_reject(state: Any, kind: str) -> str:
    """Either ``state`` loads and the resumed epoch is exactly the batches it leaves, or it is
    a ConfigError and the loader is unchanged. Anything else fails the test."""
    loader = _loader(kind=kind)
    tracemalloc.start()
    try:
        loader.load_state_dict(state)
        outcome = "loaded"
    except ConfigError:
        outcome = "rejected"
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < LOAD_PEAK_BYTES, f"loading the state allocated {peak} bytes"
    got = _epoch(loader)
    if outcome == "rejected":
        assert got == _fresh(kind)
        return outcome
    # The same state with nothing delivered: its whole epoch, a real one.
    whole_state = dict(state)
    whole_state[D] = {P: 0, RE: []}
    whole_loader = _loader(kind=kind)
    whole_loader.load_state_dict(whole_state)
    whole = _epoch(whole_loader)
    seen = [i for b in whole for i, _ in b]
    assert len(set(seen)) == len(seen) and set(seen) <= set(range(N))
    if kind == "shuffle":
        assert sorted(seen) == list(range(N))
    done = set() if state[S.KEY_FINISHED] else _delivered(state)
    assert got == [b for k, b in enumerate(whole) if k not in done]
    return outcome


_INTERESTING = [-1, 0, 1, 2, 3, 7, 8, 9, N - 1, N, N + 1, 2**31, 2**48, 2**63, 2**64, 10**12]
_RNGS = [
    torch.Generator().manual_seed(SEED).get_state(),
    torch.Generator().manual_seed(3).get_state(),
]
_INVALID_RNG = torch.zeros(5056, dtype=torch.uint8)  # the right size, refused by torch
_SOME_KEYS = [*S.KEYS, P, RE, *R.STATE_KEYS]

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(_INTERESTING),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.sampled_from([*_RNGS, _INVALID_RNG, torch.zeros(3, dtype=torch.uint8)]),
)
junk = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(
            st.sampled_from(_SOME_KEYS) | st.text(max_size=4) | st.integers(-2, 9),
            inner,
            max_size=4,
        )
    ),
    max_leaves=10,
)
small = st.integers(-2, BATCHES + 2)


def _places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a nested state: dictionary keys and list items, depth first."""
    yield path
    if isinstance(value, (dict, list)):
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            yield from _places(item, (*path, key))


def _rank_state(skipped: int, world_size: int, epoch: int) -> dict[str, Any]:
    """A valid :class:`RankSampler` state: ``skipped`` samples of each of ``world_size``
    ranks consumed."""
    sampler = RankSampler(N, seed=SEED, world=World(0, world_size))
    sampler.set_epoch(epoch)
    sampler.skip(skipped)
    return sampler.state_dict()


def _bases() -> dict[str, tuple[str, dict[str, Any]]]:
    out_of_order = _saved(taken=2)
    out_of_order[D] = {P: 2, RE: [4, 6, 7]}
    finished = _saved(taken=0)
    finished[S.KEY_FINISHED] = True
    rank_skipped = _saved(taken=1, kind="rank")
    rank_skipped[S.KEY_SAMPLER] = _rank_state(skipped=4, world_size=3, epoch=1)
    return {
        "fresh": ("shuffle", _saved(taken=0)),
        "mid": ("shuffle", _saved(taken=3)),
        "last": ("shuffle", _saved(taken=BATCHES)),
        "out-of-order": ("shuffle", out_of_order),
        "finished": ("shuffle", finished),
        "rank": ("rank", _saved(taken=3, kind="rank")),
        "rank-skipped": ("rank", rank_skipped),
    }


BASES = _bases()
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(data=st.data(), base=st.sampled_from(sorted(BASES)))
def test_fuzz_mutations_of_a_saved_state_load_exactly_or_are_config_errors(
    data: st.DataObject, base: str
) -> None:
    kind, saved = BASES[base]
    state = copy.deepcopy(saved)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        places = list(_places(state))[1:]
        if not places:
            break
        path = data.draw(st.sampled_from(places), label="where")
        holder = state
        for key in path[:-1]:
            holder = holder[key]
        # Mostly nudges (an int moved a little, a flag flipped), which often leave a valid
        # state: the oracle must be exercised, not only the rejections.
        how = ["nudge", "nudge", "nudge", "junk", "drop", "add"]
        op = data.draw(st.sampled_from(how), label="how")
        value = holder[path[-1]]
        if op == "nudge" and isinstance(value, bool):
            holder[path[-1]] = not value
        elif op == "nudge" and isinstance(value, int):
            holder[path[-1]] = value + data.draw(st.integers(-3, 3), label="by")
        elif op == "nudge":
            holder[path[-1]] = data.draw(small, label="value")
        elif op == "junk":
            holder[path[-1]] = data.draw(junk, label="value")
        elif op == "drop" and isinstance(holder, dict):
            del holder[path[-1]]
        elif op == "drop":
            holder.pop(path[-1])
        elif isinstance(holder, dict):
            holder[data.draw(st.sampled_from(_SOME_KEYS) | st.text(max_size=4))] = data.draw(junk)
        else:
            holder.append(data.draw(junk))
    _load_or_reject(state, kind)


def _mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid`` values nine times in ten, else junk: whole states are often valid."""
    return st.sampled_from(range(10)).flatmap(lambda k: junk if k == 9 else valid)


def _state_like(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    """Dictionaries with the loader state's keys and values that are often valid."""
    sampler: st.SearchStrategy[Any] = st.none()
    if kind == "rank":
        sampler = st.none() | st.builds(
            _rank_state, st.integers(0, N), st.integers(1, 4), st.integers(0, 3)
        )
    delivered = st.fixed_dictionaries(
        {P: small, RE: st.lists(st.integers(0, BATCHES - 1), max_size=8) | st.lists(small)}
    )
    return st.fixed_dictionaries(
        {
            S.KEY_VERSION: _mostly(st.just(1)),
            S.KEY_EPOCH: _mostly(st.integers(0, 3)),
            S.KEY_RNG: _mostly(st.sampled_from([None, *_RNGS, _INVALID_RNG])),
            S.KEY_DELIVERED: _mostly(delivered),
            S.KEY_FINISHED: _mostly(st.booleans()),
        },
        optional={
            S.KEY_SAMPLER: _mostly(sampler),
            S.KEY_BASE_SEED: _mostly(st.none() | st.integers(0, 2**63 - 1)),
            S.KEY_ITER_EPOCH: _mostly(st.integers(0, 3)),
            S.KEY_WORKER_STATES: _mostly(st.just({})),
            S.KEY_WORKERS: _mostly(st.integers(0, 3)),
            S.KEY_LENGTH: _mostly(st.sampled_from([None, N])),
        },
    )


@FUZZ
@given(data=st.data(), kind=st.sampled_from(["shuffle", "rank"]))
def test_fuzz_random_structures_load_exactly_or_are_config_errors(
    data: st.DataObject, kind: str
) -> None:
    state = data.draw(junk | _state_like(kind) | _state_like(kind) | _state_like(kind))
    _load_or_reject(state, kind)


@FUZZ
@given(data=st.data())
def test_fuzz_mutations_of_a_sampler_state_load_or_are_config_errors(data: st.DataObject) -> None:
    """:class:`RankSampler` on its own: a state it takes yields distinct indices of the
    dataset, as many as its length said."""
    state = _rank_state(
        data.draw(st.integers(0, N)), data.draw(st.integers(1, 4)), data.draw(st.integers(0, 3))
    )
    for _ in range(data.draw(st.integers(1, 2))):
        path = data.draw(st.sampled_from(list(_places(state))[1:]))
        holder: Any = state
        for key in path[:-1]:
            holder = holder[key]
        value = holder[path[-1]]
        if isinstance(value, int) and not isinstance(value, bool) and data.draw(st.booleans()):
            holder[path[-1]] = value + data.draw(st.integers(-3, 3))
        else:
            holder[path[-1]] = data.draw(small | junk)
    sampler = RankSampler(N, seed=SEED, world=World())
    try:
        sampler.load_state_dict(state)
    except ConfigError:
        assert list(sampler) == list(RankSampler(N, seed=SEED, world=World()))
        return
    length = len(sampler)
    got = list(sampler)
    assert len(got) == length and len(set(got)) == length and set(got) <= set(range(N))


def test_the_fuzz_reaches_both_outcomes() -> None:
    """The oracle is exercised on states that load, not only on rejections."""
    outcomes = {_load_or_reject(copy.deepcopy(state), kind) for kind, state in BASES.values()}
    bad = copy.deepcopy(BASES["mid"][1])
    bad[S.KEY_EPOCH] = -1
    outcomes.add(_load_or_reject(bad, "shuffle"))
    assert outcomes == {"loaded", "rejected"}
