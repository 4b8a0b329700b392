"""Work done in steps: a generator that pauses (yields None) between steps and returns its result, so that a
caller can serve other work meanwhile (the actor answers admissions during a resync). `drain` runs one to its
end without pausing: the plain form of every stepped operation is its stepped form drained, one code path."""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")

Steps = Generator[None, None, T]


def drain(steps: Steps[T]) -> T:
    """Run a stepped operation to its end without pausing: its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
