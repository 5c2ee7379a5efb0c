"""Sweeps: files, the Ray Tune driver, the trial side, console and status."""
import time

IMPORT_T0 = time.perf_counter()  # a Ray worker imports this package first: the start of the project's imports
