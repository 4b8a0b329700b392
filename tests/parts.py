"""What a test does when a part of the test machine is missing (a binary, the real node's runtime, root)."""

from __future__ import annotations

import os

import pytest


def every_part_required() -> bool:
    """In CI and under `make test` (GPULEDGER_REQUIRE_ALL) every part must be there: a skip would hide it."""
    return any(
        os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("CI", "GPULEDGER_REQUIRE_ALL")
    )


def missing_part(message: str) -> None:
    """Fail where every part is required, else skip; `message` names the part and the command bringing it."""
    if every_part_required():
        pytest.fail(message)
    pytest.skip(message)
