"""``python -m tfcalc``."""

from tfcalc.cli import main

main()
