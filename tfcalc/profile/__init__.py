"""The profiler: runs the bundled decoder on this device and measures it beside the calculator's prediction.

Imports torch; only ``tfcalc.cli.profile`` and ``tfcalc.cli.bench`` load it, inside their commands.
"""
