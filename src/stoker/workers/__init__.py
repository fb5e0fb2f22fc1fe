"""Workers: where samples are fetched and collated.

``_backend.py`` is the interface the iterator uses (:class:`WorkerBackend`), implemented by
``_process.py`` (worker processes: fork, forkserver, spawn, and their pipes) and
``_threads.py`` (worker threads); ``_messages.py`` holds the typed records they exchange with
the main process; ``_loop.py`` is the code that runs inside each worker process;
``_collate.py`` lets torch's ``default_collate`` stack straight into a shared-memory slot;
``_errors.py`` carries exceptions from a worker to the main process with their type and
traceback; ``_thread_caps.py`` caps each worker's native thread pools.
"""

from stoker.workers._process import WorkerPool

__all__ = ["WorkerPool"]
