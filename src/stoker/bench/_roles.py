"""The words the bench's table, verdict and plot use for the contenders' roles, defined once."""

from __future__ import annotations

from stoker.bench._result import Role

__all__ = ["ROLES_EXPLAINED", "ROLE_TEXT", "role_label"]

# Role -> the words for it, in the table's `role` column and in the plot's legend.
ROLE_TEXT: dict[Role, str] = {
    "torch-nw0": "baseline",
    "torch-recommended": "seed recipe",
    "torch-same": "same nw",
    "torch-best": "grid best",
    "torch-persistent": "persistent",
    "stoker": "defaults",
    "stoker-auto": 'num_workers="auto"',
    "stoker-watched": "in stoker.watch",
    "optional": "best of its grid",
    "torch-other": "",
}

#: What the roles mean, printed under the table and at the foot of the plot.
ROLES_EXPLAINED = (
    "roles: baseline = no workers; seed recipe = the usual advice, 0.7 x cores workers, "
    "prefetch_factor=4, persistent (pinned with CUDA); same nw = stoker's num_workers at "
    "torch's better prefetch_factor; grid best = winner of torch's short grid search; "
    'defaults = stoker.DataLoader with no tuning; num_workers="auto" = stoker as the '
    "README recommends; best of its grid = an optional library (SPDL threads, torchdata.nodes "
    "workers x prefetch) at the winner of its own short grid search."
)


def role_label(library: str, role: Role) -> str:
    """``"torch, seed recipe"``: a library and a role, as the plot's legend writes them."""
    return f"{library}, {ROLE_TEXT[role]}"
