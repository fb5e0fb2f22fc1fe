"""The loader engine: ``stoker.DataLoader``, its iterators, and what they keep per epoch.

``_loader`` holds the class; ``_arguments`` and ``_config`` resolve its settings;
``_iterator`` (with ``_replies``, ``_recovery`` and ``_switch``) runs the worker pool for
``num_workers > 0`` and ``_inline`` runs ``num_workers=0``; ``_dispatch`` books which batch
went where; ``_epoch_handle``, ``_distributed`` and ``_stats`` are what the loop, the ranks and
the tools see.
"""

from stoker.loader._loader import Backend, DataLoader

__all__ = ["Backend", "DataLoader"]
