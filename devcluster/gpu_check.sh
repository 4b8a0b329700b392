#!/usr/bin/env bash
# The NVML path on a real GPU, as one prepared run for a GPU machine (the project's lent device machine, or a
# GPU node): what the driver reports, a raw look at NVML's process list beside a CUDA process of known pid,
# the agent's printed patch, then tests/node_agent/test_nvml_real.py (its XID tests make a CUDA kernel fault on
# purpose: an application's error, the GPU stays usable). Needs python3 with nvidia-ml-py, PyYAML, pytest,
# torch and cupy; writes its logs under ${OUT:-/tmp/gpu_check}. `--noconftest`: the suite's conftest
# imports the control plane's harness (devcluster, certs and their packages), which this module does not use
# and a GPU machine's Python may lack.
set -u
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version --format=csv
  python3 --version
  python3 -m pip show nvidia-ml-py 2>/dev/null | sed -n 2p
  python3 - <<'PY'
import os, subprocess, sys, time
import pynvml
pynvml.nvmlInit()
print("NVML", pynvml.nvmlSystemGetNVMLVersion(), "driver", pynvml.nvmlSystemGetDriverVersion())
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
for name, args in (("nvmlDeviceGetRetiredPagesPendingStatus", ()), ("nvmlDeviceGetRemappedRows", ()),
                   ("nvmlDeviceGetEccMode", ()), ("nvmlDeviceGetSupportedEventTypes", ()),
                   ("nvmlDeviceGetTotalEccErrors", (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                    pynvml.NVML_VOLATILE_ECC))):
    try:
        print(name, *args, getattr(pynvml, name)(handle, *args))
    except pynvml.NVMLError as exc:
        print(name, type(exc).__name__, exc)
holder = subprocess.Popen(
    [sys.executable, "-c", "import sys, torch; x = torch.empty(2048 << 20, dtype=torch.uint8, device='cuda');"
     " torch.cuda.synchronize(); print('ready', flush=True); sys.stdin.read()"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
print("holder", holder.stdout.readline().strip(), "pid", holder.pid, "this pid", os.getpid())
for _ in range(20):
    rows = {}
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            rows[name] = [(p.pid, p.usedGpuMemory) for p in getattr(pynvml, name)(handle)]
        except pynvml.NVMLError as exc:
            rows[name] = repr(exc)
    if rows["nvmlDeviceGetComputeRunningProcesses"]:
        break
    time.sleep(0.5)
print("processes", rows)
print("memory used MiB", pynvml.nvmlDeviceGetMemoryInfo(handle).used >> 20)
print("holder cgroup:", open(f"/proc/{holder.pid}/cgroup").read().strip())
holder.stdin.close()
holder.wait()
PY
  python3 -m gpuledger.node_agent --node gpu-node --print --pod-resources-socket /nonexistent.sock > "$out/agent_patch.json"
  echo "agent --print exit $?"
  cat "$out/agent_patch.json"
} 2>&1 | tee "$out/facts.log"
python3 -m pytest -p no:cacheprovider --noconftest -v tests/node_agent/test_nvml_real.py 2>&1 | tee "$out/pytest.log"
exit "${PIPESTATUS[0]}"
