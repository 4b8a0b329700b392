"""Every call the cluster sync sends over the ledger channel is one the actor's channel serves: a method
left out is answered with an error on every pass (the sync then resyncs in a loop), not sent by Ray."""

from __future__ import annotations

import inspect

from gpuledger.ray.channel import CHANNEL_METHODS
from gpuledger.sync.channel import ChannelLedgerTarget
from gpuledger.sync.targets import CallingTarget


def test_every_method_the_sync_sends_over_the_channel_is_served():
    sent = {
        name
        for name, member in inspect.getmembers(CallingTarget, inspect.isfunction)
        if not name.startswith("_") and getattr(ChannelLedgerTarget, name) is member  # not sent by Ray
    }
    assert sent - CHANNEL_METHODS == set()
