"""The loader engine: ``stoker.DataLoader``, its iterators, and what they keep per epoch.

``_loader`` holds the class; ``_arguments``, ``_config`` and ``_settings`` check and resolve
its arguments into the frozen settings its iterators run with; ``_iterator`` runs the worker
pool for ``num_workers > 0``, composed of ``_start`` (the pool's start), ``_epoch`` (the epoch
being loaded), ``_replies`` (worker replies into batches), ``_recovery`` (hangs, deaths,
restarts) and ``_switch`` (processes handed over to threads); ``_inline`` runs
``num_workers=0``; ``_dispatch`` books which batch
went where; ``_epoch_handle``, ``_distributed`` and ``_stats`` are what the loop, the ranks and
the tools see.
"""

from stoker.loader._loader import Backend, DataLoader

__all__ = ["Backend", "DataLoader"]
