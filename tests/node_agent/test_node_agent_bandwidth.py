"""The node agent's network bandwidth, read from a temporary tree laid out like /sys: InfiniBand ports'
rates (ACTIVE ones, summed) before Ethernet links' speeds (physical, up, the fastest), and its label."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from gpuledger.names import AGENT_NETWORK_BANDWIDTH_LABEL, NETWORK_BANDWIDTH_LABEL
from gpuledger.node_agent.agent import NodeAgent, node_patch
from gpuledger.node_agent.bandwidth import label_value, node_bandwidth_gbps
from gpuledger.node_agent.probes import FakeProbe
from tests.node_agent.node_store import NodeStore

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def ib_port(root: Path, device: str, port: int, rate: str, state: str = "4: ACTIVE") -> None:
    d = root / "class" / "infiniband" / device / "ports" / str(port)
    d.mkdir(parents=True)
    (d / "rate").write_text(rate + "\n")
    (d / "state").write_text(state + "\n")


def interface(root: Path, name: str, speed: str | None, operstate: str = "up", physical: bool = True) -> None:
    """A /sys/class/net entry: a physical one is a link into devices/pci... with a `device` link; a virtual
    one a link into devices/virtual/net, without."""
    where = root / "devices" / ("virtual/net" if not physical else "pci0000:00/0000:00:03.0/net") / name
    where.mkdir(parents=True)
    if physical:
        (where / "device").symlink_to(where.parent.parent)
    if speed is not None:
        (where / "speed").write_text(speed + "\n")
    (where / "operstate").write_text(operstate + "\n")
    net = root / "class" / "net"
    net.mkdir(parents=True, exist_ok=True)
    (net / name).symlink_to(where)


def test_active_infiniband_ports_add_up(tmp_path):
    ib_port(tmp_path, "mlx5_0", 1, "200 Gb/sec (4X HDR)")
    ib_port(tmp_path, "mlx5_1", 1, "200 Gb/sec (4X HDR)")
    ib_port(tmp_path, "mlx5_2", 1, "400 Gb/sec (4X NDR)", state="1: DOWN")
    ib_port(tmp_path, "mlx5_3", 1, "2.5 Gb/sec (1X SDR)", state="2: INIT")
    assert node_bandwidth_gbps(tmp_path) == 400.0


def test_ethernet_the_fastest_physical_link_that_is_up(tmp_path):
    interface(tmp_path, "lo", "-1", operstate="unknown", physical=False)
    interface(tmp_path, "eth0", "25000")
    interface(tmp_path, "eth1", "100000")
    interface(tmp_path, "eth2", "400000", operstate="down")  # down: not counted
    interface(tmp_path, "eth3", "-1")  # unknown speed
    interface(tmp_path, "eth4", None)  # unreadable speed
    interface(tmp_path, "eth5", "fast")
    interface(tmp_path, "br0", "800000", physical=False)  # a bridge, a veth, a bond: virtual
    assert node_bandwidth_gbps(tmp_path) == 100.0


def test_infiniband_wins_over_ethernet(tmp_path):
    interface(tmp_path, "eth0", "100000")
    ib_port(tmp_path, "mlx5_0", 1, "100 Gb/sec (4X EDR)")
    ib_port(tmp_path, "mlx5_0", 2, "56 Gb/sec (4X FDR)")
    assert node_bandwidth_gbps(tmp_path) == 156.0


def test_down_infiniband_ports_leave_the_ethernet_speed(tmp_path):
    interface(tmp_path, "eth0", "10000")
    ib_port(tmp_path, "mlx5_0", 1, "200 Gb/sec (4X HDR)", state="1: DOWN")
    assert node_bandwidth_gbps(tmp_path) == 10.0


def test_nothing_to_read_says_nothing(tmp_path):
    assert node_bandwidth_gbps(tmp_path) is None
    interface(tmp_path, "lo", "-1", operstate="unknown", physical=False)
    interface(tmp_path, "eth0", "10000", operstate="down")
    ib_port(tmp_path, "mlx5_0", 1, "200 Gb/sec (4X HDR)", state="1: DOWN")
    ib_port(tmp_path, "mlx5_1", 1, "garbage")
    assert node_bandwidth_gbps(tmp_path) is None


def test_label_values():
    assert [label_value(v) for v in (200.0, 12.5, 0.1, 156.0)] == ["200", "12.5", "0.1", "156"]


def test_the_patch_carries_the_agents_label_and_removes_a_stale_one():
    reports = FakeProbe.from_spec("2xH100:81559").devices()
    labels = node_patch(reports, NOW, bandwidth_gbps=400.0)["metadata"]["labels"]
    assert labels[AGENT_NETWORK_BANDWIDTH_LABEL] == "400"
    assert NETWORK_BANDWIDTH_LABEL not in labels  # the operator's label is never written by the agent
    assert (
        node_patch(reports, NOW, bandwidth_gbps=None)["metadata"]["labels"][AGENT_NETWORK_BANDWIDTH_LABEL]
        is None
    )
    assert AGENT_NETWORK_BANDWIDTH_LABEL not in node_patch(reports, NOW)["metadata"]["labels"]


def test_the_agent_publishes_what_its_sys_root_says(tmp_path):
    ib_port(tmp_path, "mlx5_0", 1, "200 Gb/sec (4X HDR)")
    store = NodeStore()
    agent = NodeAgent(
        "n1", FakeProbe.from_spec("2xH100:81559"), store, interval_s=60, sys_root=tmp_path, boot_id="b"
    )
    patch = agent.publish_once(NOW)
    assert patch["metadata"]["labels"][AGENT_NETWORK_BANDWIDTH_LABEL] == "200"
