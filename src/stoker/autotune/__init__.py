"""Online tuning while the loader runs: ``num_workers="auto"`` and ``backend="auto"``.

``_controller`` decides the worker count from measurements (pure, no processes), with its
parts: ``_observation`` (what it is fed and answers), ``_fill`` (workers that keep the cores
busy, the blocked share), ``_trials`` (judging a change on the rate) and ``_prefetch`` (the
prefetch depth); ``_scaling`` feeds it and applies its answers. ``_probe`` picks inline,
thread or process loading (its measurements in ``_probe_passes``, its rules, and the handover
to threads judged on the training loop, in ``_backend_rule``); ``_gil`` measures what thread
workers pay for the GIL and how much the training loop's thread runs.
"""
