"""Critical XID errors and uncorrectable ECC errors keep a GPU out of placement until it is reset; the record
of an XID lives on the Node, so a restarted agent publishes the same health and an operator's clearing holds.

The GPU is the fake probe here (its `report_xid` is what the driver's event does); the real NVML event path is
tests/node_agent/test_nvml_real.py, the real API server tests/e2e/test_node_agent_e2e.py.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devcluster.nodes import make_node
from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, Placement, Reason, Request
from gpuledger.names import XIDS_ANNOTATION
from gpuledger.node_agent.agent import NodeAgent, main, node_patch
from gpuledger.node_agent.pod_resources import PodResourcesClient
from gpuledger.node_agent.probes import DeviceReport, FakeProbe, QueryFailed, XidEvent, memory_health
from gpuledger.node_agent.xids import APPLICATION_XIDS, KEPT_PER_DEVICE, XidLog, parse_ignored, read_boot_id
from tests.node_agent.node_store import NodeStore

NOW = datetime(2026, 11, 27, 19, 0, tzinfo=UTC)
BOOT = "6d2f1c3e-0000-4000-8000-000000000001"
REPORTS = [DeviceReport(i, f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd", "H100", 81559, True) for i in range(4)]
NO_KUBELET = PodResourcesClient("/nonexistent/kubelet.sock", 0.1)


def agent(store: NodeStore, probe: FakeProbe, **kwargs) -> NodeAgent:
    return NodeAgent("n1", probe, store, pod_resources=NO_KUBELET, boot_id=BOOT, **kwargs)


def devices(patch: dict) -> list[dict]:
    return json.loads(patch["metadata"]["annotations"]["agentaflow.gpu/devices"])


# ---------------------------------------------------------------- the log itself
def test_a_critical_xid_marks_its_gpu_unhealthy_and_an_application_xid_does_not():
    log = XidLog(BOOT).record(
        [(XidEvent(2, 79), NOW), (XidEvent(1, 31), NOW), (XidEvent(1, 43), NOW)], REPORTS, APPLICATION_XIDS
    )
    assert set(log.devices) == {REPORTS[2].uuid}
    marked = log.mark(REPORTS)
    assert [r.healthy for r in marked] == [True, True, False, True]
    reason = marked[2].reason
    assert "critical XID 79" in reason and "2026-11-27T19:00:00Z" in reason and XIDS_ANNOTATION in reason
    # nothing ignored: an application's fault counts too (`--ignore-xids none`)
    strict = XidLog(BOOT).record([(XidEvent(1, 31), NOW)], REPORTS, frozenset())
    assert [r.healthy for r in strict.mark(REPORTS)] == [True, False, True, True]


def test_the_annotation_is_compact_sorted_and_reads_back_to_the_same_log():
    events = [(XidEvent(0, 48), NOW), (XidEvent(0, 79), NOW + timedelta(seconds=5))]
    log = XidLog(BOOT).record(events, REPORTS, APPLICATION_XIDS)
    text = log.annotation()
    assert text == (
        '{"bootId":"' + BOOT + '","devices":{"' + REPORTS[0].uuid + '":['
        '{"at":"2026-11-27T19:00:00Z","xid":48},{"at":"2026-11-27T19:00:05Z","xid":79}]},"v":1}'
    )
    again = XidLog.from_annotation(text, BOOT)
    assert again == log and again.annotation() == text
    assert "critical XID 48, 79 (the last at 2026-11-27T19:00:05Z)" in again.mark(REPORTS)[0].reason


def test_an_empty_log_removes_the_annotation_and_another_boots_log_is_void():
    assert XidLog(BOOT).annotation() is None
    text = XidLog(BOOT).record([(XidEvent(3, 94), NOW)], REPORTS, APPLICATION_XIDS).annotation()
    rebooted = XidLog.from_annotation(text, "another-boot")
    assert rebooted.devices == {} and rebooted.annotation() is None
    assert XidLog.from_annotation(text, "").devices == {}  # no boot id here: not this record's boot
    # an agent that cannot read the boot id keeps its own records (only a clear ends them)
    unbooted = XidLog("").record([(XidEvent(3, 94), NOW)], REPORTS, APPLICATION_XIDS)
    assert XidLog.from_annotation(unbooted.annotation(), "") == unbooted


@pytest.mark.parametrize("text", ["not json", "[]", '{"bootId":"' + BOOT + '","devices":{"G":[{"x":1}]}}'])
def test_a_malformed_annotation_reads_as_empty_and_is_logged(text, caplog):
    assert XidLog.from_annotation(text, BOOT).devices == {}
    assert XIDS_ANNOTATION in caplog.text


def test_a_failing_gpu_keeps_only_its_newest_records():
    events = [(XidEvent(0, 79), NOW + timedelta(seconds=i)) for i in range(KEPT_PER_DEVICE + 5)]
    log = XidLog(BOOT).record(events, REPORTS, APPLICATION_XIDS)
    assert len(log.devices[REPORTS[0].uuid]) == KEPT_PER_DEVICE
    assert log.devices[REPORTS[0].uuid][-1].at == "2026-11-27T19:00:12Z"


def test_an_already_unhealthy_gpu_keeps_its_first_reason_too():
    sick = [REPORTS[0].__class__(0, REPORTS[0].uuid, "H100", 81559, False, reason="a memory row remapping is "
                                 "pending a GPU reset")]  # fmt: skip
    marked = XidLog(BOOT).record([(XidEvent(0, 63), NOW)], sick, APPLICATION_XIDS).mark(sick)
    assert marked[0].reason.startswith("a memory row remapping is pending a GPU reset; critical XID 63")


@pytest.mark.parametrize(
    "text, ignored", [("13,31", {13, 31}), (" 43 , 45 ", {43, 45}), ("none", set()), ("", set())]
)
def test_ignore_xids_parses_numbers_or_none(text, ignored):
    assert parse_ignored(text) == frozenset(ignored)


@pytest.mark.parametrize("text", ["13,x", "-1", "31;43"])
def test_a_bad_ignore_list_names_the_flag_the_value_and_the_form(text):
    with pytest.raises(ValueError) as err:
        parse_ignored(text)
    message = str(err.value)
    assert "--ignore-xids" in message and repr(text) in message and "13,31,43,45,68,109" in message


def test_the_boot_id_is_read_from_the_proc_root(tmp_path):
    (tmp_path / "sys" / "kernel" / "random").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT + "\n")
    assert read_boot_id(tmp_path) == BOOT
    assert read_boot_id(tmp_path / "missing") == ""
    assert len(read_boot_id(Path("/proc"))) == 36  # this machine's


# ---------------------------------------------------------------- ECC
@pytest.mark.parametrize(
    "uncorrected, words",
    [
        (None, ""),  # ECC off: the query is not supported
        (0, ""),
        (3, "3 uncorrectable ECC errors since the GPU's last reset"),
        (QueryFailed("Unknown Error"), "ECC query failed: Unknown Error"),
    ],
)
def test_uncorrectable_ecc_errors_since_the_last_reset_make_a_gpu_unhealthy(uncorrected, words):
    reason = memory_health(None, (0, 0, 0, 0), uncorrected)
    assert (words in reason) if words else reason == ""


# ---------------------------------------------------------------- the fake probe
def test_the_fake_spec_reports_its_xids_once():
    probe = FakeProbe.from_spec('{"gpus": "2xH100:81559", "xids": [[1, 79]]}')
    assert probe.xid_events() == [XidEvent(1, 79)]
    assert probe.xid_events() == []
    probe.report_xid(0, 48)
    assert probe.xid_events() == [XidEvent(0, 48)]


def test_bad_fake_xids_name_the_form():
    with pytest.raises(ValueError) as err:
        FakeProbe.from_spec('{"gpus": "2xH100:81559", "xids": [[1]]}')
    assert "[[INDEX, XID], ...]" in str(err.value)


# ---------------------------------------------------------------- the agent
def test_the_agent_records_an_xid_on_the_node_and_a_restart_publishes_the_same_health():
    store, probe = NodeStore(), FakeProbe(REPORTS)
    first = agent(store, probe)
    first.publish_once(NOW)
    assert XIDS_ANNOTATION not in store.annotations
    probe.report_xid(2, 79)
    changed = first.publish_if_changed(NOW)  # holders unchanged: the XID alone is worth a patch
    assert changed is not None and [d["healthy"] for d in devices(changed)] == [True, True, False, True]
    assert json.loads(store.annotations[XIDS_ANNOTATION])["devices"] == {
        REPORTS[2].uuid: [{"at": "2026-11-27T19:00:00Z", "xid": 79}]
    }
    assert first.publish_if_changed(NOW) is None  # published: nothing more to send

    restarted = agent(store, FakeProbe(REPORTS))  # a new process: NVML will not tell it again
    later = restarted.publish_once(NOW + timedelta(minutes=1))
    assert devices(later) == devices(changed)
    assert later["metadata"]["annotations"][XIDS_ANNOTATION] == store.annotations[XIDS_ANNOTATION]


def test_an_application_fault_sends_nothing_and_leaves_the_gpu_healthy():
    store, probe = NodeStore(), FakeProbe(REPORTS)
    quiet = agent(store, probe)
    quiet.publish_once(NOW)
    probe.report_xid(1, 31)
    assert quiet.publish_if_changed(NOW) is None and len(store.patches) == 1
    assert all(d["healthy"] for d in devices(quiet.publish_once(NOW)))


def test_clearing_the_annotation_returns_the_gpu_and_is_not_overwritten():
    store, probe = NodeStore(), FakeProbe(REPORTS, xids=[XidEvent(0, 79)])
    running = agent(store, probe)
    running.publish_once(NOW)
    assert XIDS_ANNOTATION in store.annotations
    reads = []
    read = store.read_node
    store.read_node = lambda name: reads.append(name) or read(name)  # type: ignore[method-assign]
    assert running.publish_once(NOW) and reads == []  # the Node its last patch left: no GET before a patch
    store.annotate(XIDS_ANNOTATION, None)  # the operator, after resetting the GPU
    again = running.publish_once(NOW)
    assert reads == ["n1"]  # its patch on the older version was refused (409): it read the Node again
    assert all(d["healthy"] for d in devices(again)) and XIDS_ANNOTATION not in store.annotations


def test_a_clear_between_the_agents_read_and_its_patch_is_kept():
    """The patch is conditional on the Node's resourceVersion: the agent reads again and does not write back
    the record the operator removed meanwhile (a restarted agent: it reads the Node before its first
    patch)."""
    store = NodeStore()
    agent(store, FakeProbe(REPORTS, xids=[XidEvent(0, 79)])).publish_once(NOW)
    running = agent(store, FakeProbe(REPORTS))
    read = store.read_node

    def read_then_cleared(name):
        node = read(name)
        if XIDS_ANNOTATION in store.annotations:
            store.annotate(XIDS_ANNOTATION, None)  # lands after the agent's read, before its patch
        return node

    store.read_node = read_then_cleared  # type: ignore[method-assign]
    patch = running.publish_once(NOW)
    assert XIDS_ANNOTATION not in store.annotations and all(d["healthy"] for d in devices(patch))


def test_an_xid_the_api_server_did_not_take_is_published_with_the_next_patch():
    store, probe = NodeStore(), FakeProbe(REPORTS)
    running = agent(store, probe)
    running.publish_once(NOW)
    probe.report_xid(3, 119)
    patch_node = store.patch_node
    store.patch_node = lambda name, body: (_ for _ in ()).throw(ConnectionError("API server away"))  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        running.publish_if_changed(NOW)
    store.patch_node = patch_node  # type: ignore[method-assign]
    assert running.publish_if_changed(NOW + timedelta(seconds=2)) is not None
    assert json.loads(store.annotations[XIDS_ANNOTATION])["devices"] == {
        REPORTS[3].uuid: [{"at": "2026-11-27T19:00:00Z", "xid": 119}]  # when the agent first learnt of it
    }


def test_the_run_loop_patches_an_xid_between_full_publications():
    clock = [0.0]
    store, probe = NodeStore(), FakeProbe(REPORTS)
    running = agent(store, probe, interval_s=30, holders_interval_s=0.05, clock=lambda: clock[0])
    loop = threading.Thread(target=running.run, daemon=True)
    loop.start()
    deadline = time.monotonic() + 10
    while not store.patches and time.monotonic() < deadline:
        time.sleep(0.01)
    probe.report_xid(0, 79)  # clock frozen: only the XID can cause a patch
    while len(store.patches) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    running.stop()
    loop.join(5)
    assert len(store.patches) == 2 and not devices(store.patches[1])[0]["healthy"]


def test_the_ledger_places_nothing_on_a_gpu_with_a_critical_xid():
    log = XidLog(BOOT).record([(XidEvent(0, 79), NOW)], REPORTS, APPLICATION_XIDS)
    patch = node_patch(REPORTS, NOW, None, log)
    node = make_node("n1", "spine-a", "leaf-a", gpus=len(REPORTS))  # the Node the agent's patch lands on
    node["metadata"]["labels"].update(patch["metadata"]["labels"])
    node["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    ledger = Ledger.rebuild([node], LedgerConfig(placement_key=b"xid-test-key"))
    denied = ledger.reserve(Request("four", gpus=4), 0.0)
    assert isinstance(denied, Denial) and dict(denied.by_reason) == {Reason.UNHEALTHY_DEVICE: 1}
    placed = ledger.reserve(Request("three", gpus=3), 0.0)
    assert isinstance(placed, Placement) and 0 not in placed.devices


def test_print_shows_the_xids_the_fake_reports(capsys):
    argv = ["--node", "n1", "--fake", '{"gpus": "2xH100:81559", "xids": [[1, 79], [0, 31]]}', "--print",
            "--pod-resources-socket", "/nonexistent/kubelet.sock"]  # fmt: skip
    assert main(argv) == 0
    annotations = json.loads(capsys.readouterr().out)["metadata"]["annotations"]
    assert [d["healthy"] for d in json.loads(annotations["agentaflow.gpu/devices"])] == [True, False]
    assert list(json.loads(annotations[XIDS_ANNOTATION])["devices"]) == ["GPU-fake-h100-0001"]


def test_a_bad_ignore_list_is_refused_before_anything_runs(capsys):
    assert main(["--node", "n1", "--fake", "1xT4:15360", "--print", "--ignore-xids", "x"]) == 2
    assert "--ignore-xids 'x'" in capsys.readouterr().out
