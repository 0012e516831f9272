"""The "did you mean" hints of the error messages about unknown names (ids, config keys,
strategies), in a module of their own so that any module can use them."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["close_matches", "did_you_mean"]


def close_matches(name: str, choices: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The up to `n` choices closest to `name` (difflib's ratio >= `cutoff`), best first."""
    return difflib.get_close_matches(name, list(choices), n=n, cutoff=cutoff)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """A hint naming the closest of `choices` to `name` (difflib's default cutoff, 0.6).

    Returns:
        `" (did you mean 'X'?)"`, or `""` when no choice is close.
    """
    close = close_matches(name, choices)
    return f" (did you mean {close[0]!r}?)" if close else ""
