"""One verdict per workload: what a user of stoker's recommended settings gets.

The verdict leads with ``num_workers="auto"`` (what the README recommends) against the best of
torch's grid, in training steps/s first where the ``train`` family ran, then the loader-only
throughput; then stoker at the same workers as torch; then each installed peer at its best.
A ratio the repeats cannot tell apart reads "on par": within :data:`PAR_BAND` of 1.0, or, with
two runs or more each, where some run of the slower side reaches into the other's and its
runs fall as low as they do with a chance above :data:`RANK_ALPHA` had both been equal (the
exact rank test of :func:`~stoker.bench._stats.rank_p_lower`: three runs against three are
told apart only when all of one side ran below all of the other). No verdict calls stoker
slower, or faster, than the run can tell.
"""

from __future__ import annotations

from stoker.bench._result import ContenderResult, Ramp, WorkloadResult
from stoker.bench._stats import rank_p_lower, ratio
from stoker.bench._train_result import TrainContender, TrainTable

__all__ = ["PAR_BAND", "RANK_ALPHA", "apart", "compare", "verdict"]

# Ratios closer than this to 1.0 read "on par", whatever the runs.
PAR_BAND = 0.03
# Runs of two equal contenders fall as far apart as those seen with a chance above this: "on
# par". The half-range spread it replaced let one run decide (a quick bench's tiny loader read
# "1.09x slower" with stoker's runs reaching into torch's; the same loaders, six runs each in
# one session, read 236k against 236k samples/s; benchmarks/README.md).
RANK_ALPHA = 0.05
# The verdict mentions memory when stoker's PSS differs from torch's by more than this.
PSS_NOTE_BAND = 0.2

Contender = ContenderResult | TrainContender


def _rate(c: Contender) -> float | None:
    return c.steps_per_s if isinstance(c, TrainContender) else c.samples_per_s


def _rates(c: Contender) -> list[float]:
    if isinstance(c, TrainContender):
        return [r.steps_per_s for r in c.runs]
    return [r.samples_per_s for r in c.runs]


def apart(mine: Contender, theirs: Contender) -> bool:
    """Whether the runs tell the two apart: the ratio of their medians lies beyond
    :data:`PAR_BAND` and, with two runs or more each, every run of the slower side is below
    every run of the other or the rank test's p-value for it is at most :data:`RANK_ALPHA`
    (with a single run on a side, the ratio lies beyond the wider half-range spread)."""
    r = ratio(_rate(mine), _rate(theirs))
    if r is None or abs(r - 1) <= PAR_BAND:
        return False
    a, b = _rates(mine), _rates(theirs)
    if len(a) < 2 or len(b) < 2:  # no rank test: beyond the wider half-range spread
        return abs(r - 1) > max(mine.spread or 0.0, theirs.spread or 0.0)
    low, high = (a, b) if r < 1 else (b, a)
    # All of one side beyond all of the other is as far apart as their runs can tell (three
    # runs against two reach p = 0.1 at best, and must not read "on par" at 2x).
    return max(low) < min(high) or rank_p_lower(low, high) <= RANK_ALPHA


def compare(mine: Contender, theirs: Contender, what: str) -> str | None:
    """``"1.20x faster than WHAT"``, ``"1.20x slower than WHAT"`` or, where the runs cannot
    tell the two apart (:func:`apart`), ``"on par with WHAT (0.97x, spread ±5%)"`` (the larger
    of the two half-range spreads; ``", runs overlap"`` added where the ratio lies beyond it).
    ``None`` when either has no rate."""
    r = ratio(_rate(mine), _rate(theirs))
    if r is None:
        return None
    if not apart(mine, theirs):
        noise = max(PAR_BAND, mine.spread or 0.0, theirs.spread or 0.0)
        overlap = ", runs overlap" if abs(r - 1) > noise else ""
        return f"on par with {what} ({r:.2f}x, spread ±{noise:.0%}{overlap})"
    if r >= 1:
        return f"{r:.2f}x faster than {what}"
    return f"{1 / r:.2f}x slower than {what}"


def _lead(w: WorkloadResult) -> ContenderResult | None:
    """The contender the verdict speaks for: auto where it ran, else stoker's defaults."""
    return w.with_role("stoker-auto") or w.with_role("stoker")


def _peers(contenders: list[Contender], mine: Contender, label: str) -> list[str]:
    out = []
    for peer in contenders:
        said = compare(mine, peer, f"{peer.library}'s best ({peer.name})")
        if said is not None:
            out.append(f"{label} {said}")
    return out


def _train_parts(t: TrainTable) -> list[str]:
    mine = t.with_role("stoker-auto") or t.with_role("stoker")
    best = t.best("torch")
    if mine is None or best is None:
        return []
    label = f"train {t.shape}: {mine.name}"
    said = compare(mine, best, f"torch's best ({best.name})")
    parts = [f"{label} {said}"] if said else []
    libraries = sorted({c.library for c in t.contenders if c.library not in ("torch", "stoker")})
    peers: list[Contender] = [p for p in (t.best(lib) for lib in libraries) if p is not None]
    return parts + _peers(peers, mine, label)


def _ramp_text(r: Ramp) -> str:
    start = f"from {r.start_workers}"
    if r.error:
        return f"{start} failed"
    if r.reach_s is None:
        return f"{start}: not within {r.seconds:.0f} s"
    share = r.share_of_epoch
    of_epoch = f", {share:.1%} of an epoch" if share is not None else ""
    return f"{start}: {r.reach_s:.1f} s{of_epoch} (-> {r.final_workers} {r.backend})"


def _loader_parts(w: WorkloadResult, lead: ContenderResult) -> list[str]:
    parts = []
    best, same, st = w.torch_best, w.torch_same, w.stoker
    if best is not None:
        said = compare(lead, best, f"torch's best here ({best.name})")
        parts.append(f"loader: {lead.name} {said}")
    if st is not None and same is not None:
        nw = same.config.get("num_workers")
        said = compare(st, same, f"torch at the same {nw} workers ({same.name})")
        parts.append(f"same workers: {st.name} {said}")
    libraries = sorted({c.library for c in w.contenders if c.library not in ("torch", "stoker")})
    peers: list[Contender] = [p for p in (w.best(lib) for lib in libraries) if p is not None]
    parts += _peers(peers, lead, f"loader: {lead.name}")
    frac = w.fraction_of_ideal(lead)
    if frac is not None:
        parts.append(f"{lead.name} at {frac:.0%} of this machine's limit")
    return parts


def _watch_part(w: WorkloadResult) -> str | None:
    watched, st = w.with_role("stoker-watched"), w.stoker
    if watched is None or st is None or not watched.samples_per_s or not st.samples_per_s:
        return None
    ab = 1 - watched.samples_per_s / st.samples_per_s
    spreads = [x for x in (watched.spread, st.spread) if x is not None]
    noise = f" within a spread of {max(spreads):.0%}" if spreads else ""
    text = f"stoker.watch costs {ab:.1%} (A/B{noise})"
    own = watched.monitor_overhead
    if own is not None:
        text += f", {own:.2%} of wall time by its own clock"
    return text


def _memory_part(w: WorkloadResult) -> str | None:
    st, same = w.stoker, w.torch_same
    mine = st.peak_pss_bytes if st else None
    theirs = same.peak_pss_bytes if same else None
    r = ratio(mine, theirs)
    if mine is None or theirs is None or r is None or abs(r - 1) <= PSS_NOTE_BAND:
        return None
    return f"PSS {mine / 2**20:,.0f} MiB vs {theirs / 2**20:,.0f} MiB for torch at the same workers"


def _epochs_part(w: WorkloadResult) -> str | None:
    st = w.stoker
    if w.mode != "epochs" or st is None or not st.epoch_first_batch_s:
        return None
    fresh = next(
        (
            c
            for c in w.contenders
            if c.ok and c.library == "torch" and c.config.get("persistent_workers") is False
        ),
        None,
    )
    last = len(st.epoch_first_batch_s) - 1
    text = f"epoch {last + 1} first batch {1000 * st.epoch_first_batch_s[last]:.0f} ms"
    if fresh is not None and len(fresh.epoch_first_batch_s) > last:
        text += f" vs {1000 * fresh.epoch_first_batch_s[last]:.0f} ms ({fresh.name})"
    return text


CACHE_STATES = ("cold", "warm")


def _cache_parts(w: WorkloadResult) -> list[str] | None:
    """For a workload run with a cold and a warm cache (``remote``): stoker against each peer
    in the same state, in samples/s and first batch (None: not such a workload)."""
    if not any(c.config.get("cache") in CACHE_STATES for c in w.contenders):
        return None
    parts: list[str] = []
    for state in CACHE_STATES:
        same = [c for c in w.contenders if c.ok and c.config.get("cache") == state]
        mine = next((c for c in same if c.library == "stoker"), None)
        if mine is None:
            continue
        for peer in (c for c in same if c.library != "stoker"):
            said = compare(mine, peer, peer.name)
            if said:
                parts.append(f"{state}: {mine.name} {said}")
            ours, theirs = mine.first_batch_s, peer.first_batch_s
            if ours is not None and theirs is not None:
                parts.append(
                    f"{state} first batch {1000 * ours:,.0f} ms vs {1000 * theirs:,.0f} ms "
                    f"({peer.name})"
                )
    return parts


def verdict(w: WorkloadResult) -> str:
    """One line saying how stoker did on workload ``w`` (see the module docstring)."""
    if w.error:
        return f"not run: {w.error}"
    mine = [c for c in w.contenders if c.library == "stoker"]
    if not mine:
        return "no stoker contender"
    lead = _lead(w)
    if lead is None:
        return f"stoker failed: {next((c.error for c in mine if c.error), 'no runs')}"
    parts = [p for t in w.train for p in _train_parts(t)]
    cached = _cache_parts(w)
    parts += _loader_parts(w, lead) if cached is None else cached
    if w.ramps:
        parts.append("auto ramp " + ", ".join(_ramp_text(r) for r in w.ramps))
    parts += [p for p in (_watch_part(w), _memory_part(w), _epochs_part(w)) if p]
    return "; ".join(parts) if parts else "no comparison possible (torch did not run)"
