"""The cluster sync reports what the nodes' kubelets said against the ledger: each new device correction and
device conflict counted once and posted as an Event on its pod; a changed correction is new again."""

from __future__ import annotations

from gpuledger.core.ledger import LedgerConfig
from gpuledger.service.ledger_service import LedgerService
from gpuledger.sync.cluster_sync import ClusterSync
from gpuledger.sync.device_events import device_event
from tests.sync.test_sync_conflicts import RecordingCore, sync_with

CORRECTION = ["team/mine", "r1", "n1", [3], [5]]
CONFLICT = ["team/late", "r2", "the kubelet of n1 says device 0 by pod plain/f (annotation ...)"]


def test_each_new_correction_and_conflict_is_counted_and_posted_once():
    core = RecordingCore()
    sync: ClusterSync = sync_with(core)
    status = {"device_corrections": [CORRECTION], "device_conflicts": [CONFLICT]}
    assert [n[0] for n in sync.device_reports.report(status)] == ["GPUDevicesCorrected", "GPUDeviceConflict"]
    assert sync.device_reports.report(status) == []
    stats = sync.device_reports.stats
    assert (stats.corrections, stats.conflicts, stats.events) == (1, 1, 2)
    (ns, corrected), (_, conflict) = core.events
    assert ns == "team" and corrected["involvedObject"]["name"] == "mine"
    assert corrected["reason"] == "GPUDevicesCorrected" and corrected["type"] == "Normal"
    for words in ("n1", "[5]", "[3]", "r1", "agentaflow.gpu/device-holders"):
        assert words in corrected["message"]
    assert conflict["reason"] == "GPUDeviceConflict" and conflict["type"] == "Warning"
    assert "plain/f" in conflict["message"]
    moved_again = ["team/mine", "r1", "n1", [3], [6]]
    assert len(sync.device_reports.report({"device_corrections": [moved_again]})) == 1
    assert sync.device_reports.stats.corrections == 2


def test_a_failed_post_or_a_nameless_pod_never_stops_the_sync():
    sync = sync_with(RecordingCore(fail=True))
    status = {"device_corrections": [CORRECTION, ["uid:1", "r", "n", [0], [1]]], "device_conflicts": [[1]]}
    assert len(sync.device_reports.report(status)) == 2
    assert sync.device_reports.stats.events == 0


def test_the_service_status_carries_what_the_sync_reports():
    service = LedgerService(LedgerConfig(placement_key=b"k"))
    status = service.status()
    assert status["device_corrections"] == [] and status["device_conflicts"] == []
    stats = service.stats().as_dict()
    assert stats["device_corrections"] == 0 and stats["device_conflicts"] == 0 and stats["devices_moved"] == 0


def test_device_event_names_the_pod():
    body = device_event("team/p-1", "GPUDevicesCorrected", "moved", 0.0)
    assert body["metadata"]["namespace"] == "team" and body["involvedObject"]["kind"] == "Pod"
    assert body["message"] == "gpuledger: moved" and body["firstTimestamp"] == "1970-01-01T00:00:00Z"


def test_the_external_threshold_is_a_live_setting_checked_by_name():
    import dataclasses
    import json

    import pytest

    from gpuledger.core.model import Request
    from gpuledger.service.ledger_service import AdmitCall
    from gpuledger.service.settings import LedgerSettings
    from tests.core.core_factory import node

    service = LedgerService(LedgerConfig(placement_key=b"k"))
    busy = node("n1", 1)
    busy["metadata"]["annotations"]["agentaflow.gpu/device-holders"] = json.dumps(
        {"v": 1, "source": "unavailable", "holders": {}, "external": {"0": {"memoryMiB": 2000}}}
    )
    service.resync([busy], 0.0)
    (denied,) = service.admit([AdmitCall(Request("r1", gpus=1))], 1.0)
    assert "2000 MiB" in denied.message and "external_memory_threshold_mib 1024" in denied.message
    changed = dataclasses.replace(service.settings, external_memory_threshold_mib=4096)
    answer = service.apply_config(changed, "alice", 2.0)
    assert answer["changes"] == {"external_memory_threshold_mib": [1024, 4096]}
    (placed,) = service.admit([AdmitCall(Request("r2", gpus=1))], 3.0)
    assert placed.devices == (0,)
    with pytest.raises(ValueError, match="external_memory_threshold_mib=-1 is not accepted"):
        LedgerSettings(external_memory_threshold_mib=-1)
