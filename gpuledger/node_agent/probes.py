"""What a node's GPUs look like right now: NVML on a real node, a fake behind the same interface elsewhere.

The fake exists only because most machines that run the tests have no GPU; it reports what a spec says,
through the same `GpuProbe` protocol the NVML probe answers.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple, Protocol

log = logging.getLogger("gpuledger.node_agent")


@dataclass(frozen=True)
class DeviceReport:
    index: int
    uuid: str
    product: str
    memory_mib: int
    healthy: bool
    utilization_pct: int = 0
    memory_used_mib: int = 0
    reason: str = ""  # why a device is unhealthy

    def as_annotation_entry(self) -> dict:
        """The `agentaflow.gpu/devices` entry the allocator core reads (index, uuid, product, memoryMiB,
        healthy)."""
        entry = {
            "index": self.index,
            "uuid": self.uuid,
            "product": self.product,
            "memoryMiB": self.memory_mib,
            "healthy": self.healthy,
            "utilization": self.utilization_pct,
        }
        if self.reason:
            entry["reason"] = self.reason
        return entry


class GpuProcess(NamedTuple):
    """A process holding memory on a device, as the driver sees it (host pid)."""

    device: int  # DeviceReport.index (a NamedTuple field cannot be called `index`)
    pid: int
    used_memory_mib: int


class XidEvent(NamedTuple):
    """An XID error the driver reported on a device (NVML's critical-XID event), as it happened."""

    device: int  # DeviceReport.index
    xid: int


class QueryFailed(str):
    """An NVML health query that failed (its error's text): the device is suspect."""


def memory_health(
    retired_pending: int | QueryFailed | None,
    remapped_rows: tuple[int, int, int, int] | QueryFailed | None,
    uncorrected_ecc: int | QueryFailed | None = None,
) -> str:
    """Why a device's memory makes it unhealthy, or "".

    `retired_pending`: nvmlDeviceGetRetiredPagesPendingStatus (page retirement, the memory repair of GPUs
    before Ampere); `remapped_rows`: nvmlDeviceGetRemappedRows' (corrected, uncorrectable, pending, failure)
    (row remapping, which replaced it from Ampere on: the A100, H100 and H200 report memory faults only this
    way). None: the GPU does not support that query. A pending retirement or remapping takes effect only at
    the next GPU reset, so until then the faulty memory is still in use; a failed remapping (no spare rows
    left) needs the GPU replaced. `uncorrected_ecc`: nvmlDeviceGetTotalEccErrors' uncorrected errors since the
    last reset (volatile); None where ECC is off: data a kernel read may have been wrong.
    """
    answers = (
        ("page-retirement", retired_pending),
        ("row-remapping", remapped_rows),
        ("ECC", uncorrected_ecc),
    )
    for query, answer in answers:
        if isinstance(answer, QueryFailed):
            return f"{query} query failed: {answer}"
    if retired_pending:
        return "retired memory pages pending a reset"
    if isinstance(remapped_rows, tuple):
        corrected, uncorrectable, pending, failure = remapped_rows
        if failure:
            return (
                f"row remapping failed ({uncorrectable} rows remapped for uncorrectable errors, "
                f"{corrected} for correctable): the GPU needs replacing"
            )
        if pending:
            return "a memory row remapping is pending a GPU reset"
    if uncorrected_ecc:
        return f"{uncorrected_ecc} uncorrectable ECC errors since the GPU's last reset"
    return ""


class ProbeError(RuntimeError):
    """The probe cannot read the GPUs at all (no driver, no library)."""


class GpuProbe(Protocol):
    def devices(self) -> list[DeviceReport]: ...

    def processes(self) -> list[GpuProcess]: ...

    def xid_events(self) -> list[XidEvent]:
        """The XID errors reported since the last call (each returned once)."""
        ...

    def close(self) -> None: ...


class XidInbox:
    """XID events delivered by one thread (NVML's watcher, a test) and taken by another (the agent's loop)."""

    def __init__(self, events: list[XidEvent] | None = None) -> None:
        self._xids = list(events or [])
        self._lock = threading.Lock()

    def report_xid(self, device: int, xid: int) -> None:
        """What the driver does when a GPU faults: the next `xid_events` returns it."""
        with self._lock:
            self._xids.append(XidEvent(device, xid))

    def xid_events(self) -> list[XidEvent]:
        with self._lock:
            events, self._xids = self._xids, []
        return events


class NvmlProbe(XidInbox):
    """Reads devices through NVML (pynvml, shipped as nvidia-ml-py), and listens for their XID errors.

    XIDs come only as events, so a thread waits on NVML's event set from the start and keeps what arrives
    until `xid_events` takes it.
    """

    WAIT_MS = 500  # how long one wait for an event blocks: bounds how late `close` returns

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise ProbeError(f"NVML is not available on this machine: {exc}") from exc
        super().__init__()
        self._closing = threading.Event()
        self._event_set: Any = None
        self._watcher: threading.Thread | None = None
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:  # the devices can still be read: only XIDs go unseen
            log.warning("NVML gives no event set (%s): XID errors go unseen", exc)
            return
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set)
            except pynvml.NVMLError as exc:
                log.warning("GPU %d cannot report XID errors (%s): its faults go unseen", index, exc)
        self._watcher = threading.Thread(target=self._watch_xids, name="nvml-xid-events", daemon=True)
        self._watcher.start()

    def _watch_xids(self) -> None:
        nvml = self._nvml
        while not self._closing.is_set():
            try:
                data = nvml.nvmlEventSetWait(self._event_set, self.WAIT_MS)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError as exc:  # not expected; keep listening without spinning
                log.warning("waiting for XID events failed: %s", exc)
                self._closing.wait(self.WAIT_MS / 1000)
                continue
            if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                index = int(nvml.nvmlDeviceGetIndex(data.device))
            except nvml.NVMLError as exc:
                log.warning("XID %s on a GPU NVML cannot name (%s): not recorded", data.eventData, exc)
                continue
            self.report_xid(index, int(data.eventData))

    def devices(self) -> list[DeviceReport]:
        nvml = self._nvml
        reports = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            product = _text(nvml.nvmlDeviceGetName(handle))
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            healthy, reason, utilization = True, "", 0
            try:
                utilization = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except nvml.NVMLError as exc:  # a device that cannot report utilization is suspect
                healthy, reason = False, f"utilization query failed: {exc}"
            retired = self._query(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
            remapped = self._query(nvml.nvmlDeviceGetRemappedRows, handle)
            uncorrected = self._query(self._uncorrected_ecc, handle)
            if memory_problem := memory_health(retired, remapped, uncorrected):
                healthy, reason = False, memory_problem
            reports.append(
                DeviceReport(
                    index=index,
                    uuid=uuid,
                    product=product,
                    memory_mib=int(memory.total) // (1024 * 1024),
                    memory_used_mib=int(memory.used) // (1024 * 1024),
                    healthy=healthy,
                    utilization_pct=utilization,
                    reason=reason,
                )
            )
        return reports

    def _uncorrected_ecc(self, handle: Any) -> int:
        nvml = self._nvml
        uncorrected, volatile = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        return int(nvml.nvmlDeviceGetTotalEccErrors(handle, uncorrected, volatile))

    def _query(self, query: Callable[[Any], Any], handle: Any) -> Any:
        """A health query's answer; None where the GPU or driver does not support it; the error's text
        (`QueryFailed`) where it failed."""
        try:
            return query(handle)
        except (self._nvml.NVMLError_NotSupported, self._nvml.NVMLError_FunctionNotFound):
            return None
        except self._nvml.NVMLError as exc:
            return QueryFailed(str(exc))

    def processes(self) -> list[GpuProcess]:
        """Compute and graphics processes per device; a pid in both lists counts once (its larger figure).

        usedGpuMemory is bytes, or None where the driver withholds it. CI has no GPU: tests/node_agent/
        test_nvml_real.py runs this on a real one (docs/node-agent.md, "On a real GPU").
        """
        nvml = self._nvml
        seen: dict[tuple[int, int], int] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            for query in (
                nvml.nvmlDeviceGetComputeRunningProcesses,
                nvml.nvmlDeviceGetGraphicsRunningProcesses,
            ):
                try:
                    running = query(handle)
                except nvml.NVMLError:  # e.g. NotSupported for graphics on a datacenter GPU
                    continue
                for proc in running:
                    mib = int(proc.usedGpuMemory or 0) // (1024 * 1024)
                    key = (index, int(proc.pid))
                    seen[key] = max(seen.get(key, 0), mib)
        return [GpuProcess(index, pid, mib) for (index, pid), mib in sorted(seen.items())]

    def close(self) -> None:
        self._closing.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5 * self.WAIT_MS / 1000)
            self._nvml.nvmlEventSetFree(self._event_set)
        self._nvml.nvmlShutdown()


class FakeProbe(XidInbox):
    """Reports the devices (GPU processes, XID errors) a spec describes: for nodes and tests without a GPU."""

    def __init__(
        self,
        reports: list[DeviceReport],
        processes: list[GpuProcess] | None = None,
        xids: list[XidEvent] | None = None,
    ):
        super().__init__(xids)
        self._reports = list(reports)
        self._processes = list(processes or [])

    @classmethod
    def from_spec(cls, spec: str) -> FakeProbe:
        """`COUNTxPRODUCT:MEMORY_MIB[,unhealthy=I,J]`, e.g. `8xNVIDIA-H100-80GB-HBM3:81559,unhealthy=3`, a
        JSON list of DeviceReport fields, or a JSON object `{"gpus": <either>, "processes": [[INDEX, PID,
        MIB], ...], "xids": [[INDEX, XID], ...]}` (the XIDs reported once, as a driver would)."""
        spec = spec.strip()
        if spec.startswith("{"):
            obj = json.loads(spec)
            unknown = set(obj) - {"gpus", "processes", "xids"}
            if unknown or "gpus" not in obj:
                raise ValueError(
                    f"fake GPU spec object keys {sorted(obj)} are not accepted: it needs gpus (a spec "
                    f"string or a JSON list) and may have processes ([[INDEX, PID, MIB], ...]) and xids "
                    f"([[INDEX, XID], ...])"
                )
            gpus = obj["gpus"] if isinstance(obj["gpus"], str) else json.dumps(obj["gpus"])
            try:
                processes = [
                    GpuProcess(int(i), int(pid), int(mib)) for i, pid, mib in obj.get("processes", [])
                ]
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"fake GPU spec processes {obj.get('processes')!r} are not [[INDEX, PID, MIB], ...]"
                ) from exc
            try:
                xids = [XidEvent(int(i), int(xid)) for i, xid in obj.get("xids", [])]
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"fake GPU spec xids {obj.get('xids')!r} are not [[INDEX, XID], ...]"
                ) from exc
            return cls(cls.from_spec(gpus).devices(), processes, xids)
        if spec.startswith("["):
            return cls([DeviceReport(**entry) for entry in json.loads(spec)])
        head, _, tail = spec.partition(",")
        try:
            count_text, _, rest = head.partition("x")
            product, _, memory_text = rest.rpartition(":")
            count, memory_mib = int(count_text), int(memory_text)
        except ValueError as exc:
            raise ValueError(
                f"fake GPU spec {spec!r} is not COUNTxPRODUCT:MEMORY_MIB[,unhealthy=I,J] "
                f"(e.g. 8xNVIDIA-A100-SXM4-80GB:81920,unhealthy=3)"
            ) from exc
        unhealthy: set[int] = set()
        if tail:
            key, _, values = tail.partition("=")
            if key.strip() != "unhealthy":
                raise ValueError(f"fake GPU spec option {key!r} is unknown; accepted: unhealthy=I,J")
            unhealthy = {int(v) for v in values.replace(",", " ").split()}
        return cls(
            [
                DeviceReport(
                    index=i,
                    uuid=f"GPU-fake-{product.lower()}-{i:04d}",
                    product=product,
                    memory_mib=memory_mib,
                    healthy=i not in unhealthy,
                    reason="marked unhealthy by the fake spec" if i in unhealthy else "",
                )
                for i in range(count)
            ]
        )

    def devices(self) -> list[DeviceReport]:
        return list(self._reports)

    def processes(self) -> list[GpuProcess]:
        return list(self._processes)

    def close(self) -> None:
        pass


def report_dicts(reports: list[DeviceReport]) -> list[dict]:
    return [asdict(r) for r in reports]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
