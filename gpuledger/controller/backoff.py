"""Retry delays: exponential backoff with jitter. Pure: the random draw and the time are arguments.

Retry n (1 = the first retry) waits a nominal `min(cap, base * 2**(n-1))`, jittered into the upper half:
`nominal * (0.5 + 0.5 * draw)` with `draw` uniform in [0, 1). Half the nominal delay is guaranteed (the
schedule stays recognisable); the other half spreads retries that failed together (a lost node) apart.
"""

from __future__ import annotations

DEFAULT_BASE_S = 10.0
DEFAULT_CAP_S = 300.0
DEFAULT_MAX_RETRIES = 3


def nominal_delay(retry: int, base_s: float = DEFAULT_BASE_S, cap_s: float = DEFAULT_CAP_S) -> float:
    if retry < 1:
        raise ValueError(f"retry={retry!r} is not accepted: expected 1 or more (1 = the first retry)")
    return min(cap_s, base_s * 2 ** min(retry - 1, 62))


def retry_delay(
    retry: int, draw: float, base_s: float = DEFAULT_BASE_S, cap_s: float = DEFAULT_CAP_S
) -> float:
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"draw={draw!r} is not accepted: expected a number in [0, 1)")
    return nominal_delay(retry, base_s, cap_s) * (0.5 + 0.5 * draw)


def next_retry_time(
    now: float, retry: int, draw: float, base_s: float = DEFAULT_BASE_S, cap_s: float = DEFAULT_CAP_S
) -> float:
    return now + retry_delay(retry, draw, base_s, cap_s)
