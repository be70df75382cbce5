"""Finding the few bad messages of a batch without a per-message pass: bisection (pure).

Every stage's batch lane runs one vectorised call for the whole batch; where that call fails, the
batch is halved until each failing message stands alone. A batch with ``k`` bad messages costs
about ``k * log2(n)`` extra calls, so one poison message never costs a per-message pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def isolate_failures(
    indices: list[int],
    attempt: Callable[[list[int]], T],
    error_types: tuple[type[Exception], ...],
) -> tuple[list[tuple[list[int], T]], list[tuple[int, Exception]]]:
    """Run ``attempt`` on all ``indices``; where it fails, bisect until each failing index stands alone.

    Returns the successful (indices, result) pieces in input order and the (index, error) failures.
    """
    good: list[tuple[list[int], T]] = []
    bad: list[tuple[int, Exception]] = []
    pending: list[list[int]] = [indices] if indices else []
    while pending:
        chunk = pending.pop()
        try:
            good.append((chunk, attempt(chunk)))
        except error_types as exc:
            if len(chunk) == 1:
                bad.append((chunk[0], exc))
            else:
                middle = len(chunk) // 2
                # Push the second half first so the first half is handled first: order is kept.
                pending.append(chunk[middle:])
                pending.append(chunk[:middle])
    good.sort(key=lambda piece: piece[0][0])
    bad.sort(key=lambda failure: failure[0])
    return good, bad
