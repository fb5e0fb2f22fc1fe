"""Workers: where samples are fetched and collated.

``_process.py`` starts and stops worker processes (fork, forkserver, spawn) and owns their
pipes; ``_loop.py`` is the code that runs inside each worker; ``_collate.py`` lets torch's
``default_collate`` stack straight into a shared-memory slot; ``_errors.py`` carries
exceptions from a worker to the main process with their type and traceback.
"""

from stoker.workers._process import WorkerPool

__all__ = ["WorkerPool"]
