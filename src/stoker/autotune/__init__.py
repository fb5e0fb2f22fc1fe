"""Online tuning while the loader runs: ``num_workers="auto"`` and ``backend="auto"``.

``_controller`` decides from measurements (pure, no processes); ``_scaling`` feeds it and
applies its answers; ``_probe`` picks inline, thread or process loading; ``_gil`` measures
what thread workers pay for the GIL.
"""
