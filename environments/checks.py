"""Checks of the shape-defining constructor arguments that environments share."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_int"]


def check_int(owner: str, name: str, value: Any, minimum: int) -> int:
    """Returns `value` as an int, or raises a ValueError naming `owner` and the setting."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)
