"""The profiler: runs the bundled decoder on this device and measures it beside the calculator's prediction.

One module per job: ``sweep`` (``tfcalc profile``) measures ``measure``'s points on ``device``'s devices against
``ceilings``; ``attention``, ``moe``, ``ceilings`` and ``calibrate`` are ``tfcalc bench NAME``; ``timing`` times
calls; ``efficiency`` turns a run's rows into efficiency factors (torch-free: ``--calibration`` reads it). The
rest imports torch; only ``tfcalc.cli.profile`` and ``tfcalc.cli.bench`` load it, inside their commands.
"""
