"""Loaded by every pytest run in this repository (unit tests and nbval alike, nbval on every
notebook below notebooks/: the lessons, guide/ and solutions/): printed numbers in notebooks are
compared to the precision they were printed with (tools/nbval_numbers.py)."""

pytest_plugins = ["nbval_numbers"]  # tools/ is on pytest's path (pyproject.toml)
