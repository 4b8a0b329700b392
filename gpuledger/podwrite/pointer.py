"""JSON pointers (RFC 6901) into a pod: annotation and label names hold `/` (and may hold `~`)."""

from __future__ import annotations


def escape(token: object) -> str:
    """One reference token of a path: `~` and `/` escaped, or `gpuledger.io/placement` would be two."""
    text = str(token)
    return text.replace("~", "~0").replace("/", "~1") if "~" in text or "/" in text else text
