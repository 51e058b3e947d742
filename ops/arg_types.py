"""argparse types shared by every command.

`finite_float` is the type of every float flag: Python's float() takes "nan" and "inf", and a NaN compares
false with every bound, so `--admin-update-rate nan` used to switch the rate limit off. A non-finite value is
refused by argparse, naming the flag and the value.
"""
from __future__ import annotations

import argparse
import math


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value
