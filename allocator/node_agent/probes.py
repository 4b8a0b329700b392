"""What a node's GPUs look like right now: NVML on a real node, a fake behind the same interface elsewhere.

The fake exists only because most machines that run the tests have no GPU; it reports what a spec says,
through the same `GpuProbe` protocol the NVML probe answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple, Protocol


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


class QueryFailed(str):
    """An NVML health query that failed (its error's text): the device is suspect."""


def memory_health(
    retired_pending: int | QueryFailed | None,
    remapped_rows: tuple[int, int, int, int] | QueryFailed | None,
) -> str:
    """Why a device's memory makes it unhealthy, or "".

    `retired_pending`: nvmlDeviceGetRetiredPagesPendingStatus (page retirement, the memory repair of GPUs
    before Ampere); `remapped_rows`: nvmlDeviceGetRemappedRows' (corrected, uncorrectable, pending, failure)
    (row remapping, which replaced it from Ampere on: the A100, H100 and H200 report memory faults only this
    way). None: the GPU does not support that query. A pending retirement or remapping takes effect only at
    the next GPU reset, so until then the faulty memory is still in use; a failed remapping (no spare rows
    left) needs the GPU replaced.
    """
    for query, answer in (("page-retirement", retired_pending), ("row-remapping", remapped_rows)):
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
    return ""


class ProbeError(RuntimeError):
    """The probe cannot read the GPUs at all (no driver, no library)."""


class GpuProbe(Protocol):
    def devices(self) -> list[DeviceReport]: ...

    def processes(self) -> list[GpuProcess]: ...

    def close(self) -> None: ...


class NvmlProbe:
    """Reads devices through NVML (pynvml, shipped as nvidia-ml-py)."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise ProbeError(f"NVML is not available on this machine: {exc}") from exc

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
            if memory_problem := memory_health(retired, remapped):
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

        usedGpuMemory is bytes, or None where the driver withholds it. CI has no GPU: tests/adapters/
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
        self._nvml.nvmlShutdown()


class FakeProbe:
    """Reports the devices (and GPU processes) a spec describes: for nodes and tests without a GPU."""

    def __init__(self, reports: list[DeviceReport], processes: list[GpuProcess] | None = None):
        self._reports = list(reports)
        self._processes = list(processes or [])

    @classmethod
    def from_spec(cls, spec: str) -> FakeProbe:
        """`COUNTxPRODUCT:MEMORY_MIB[,unhealthy=I,J]`, e.g. `8xNVIDIA-H100-80GB-HBM3:81559,unhealthy=3`, a
        JSON list of DeviceReport fields, or a JSON object `{"gpus": <either>, "processes": [[INDEX, PID,
        MIB], ...]}`."""
        spec = spec.strip()
        if spec.startswith("{"):
            obj = json.loads(spec)
            unknown = set(obj) - {"gpus", "processes"}
            if unknown or "gpus" not in obj:
                raise ValueError(
                    f"fake GPU spec object keys {sorted(obj)} are not accepted: it needs gpus (a spec "
                    f"string or a JSON list) and may have processes ([[INDEX, PID, MIB], ...])"
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
            return cls(cls.from_spec(gpus).devices(), processes)
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
