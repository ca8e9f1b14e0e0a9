"""Results as rows (one dict per result, exact integers under unit-bearing keys), one module per command family.

No I/O here: the CLI hands these rows to ``tfcalc.output``.
"""
