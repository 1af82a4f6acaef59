"""Benchmarks: scripts run from a checkout (`.venv/bin/python benchmarks/NAME.py --help`); the tests
import them as `benchmarks.NAME`."""
