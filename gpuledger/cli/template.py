"""`gpuledger generate-template [FILE]`: a commented GPUWorkload, Job or Pod manifest to start from.

Writes FILE (never over an existing one without --force) or stdout. The comments say what each field does
and what it accepts; the annotations are the ones docs/annotations.md lists.
"""

from __future__ import annotations

import argparse
import os
import sys

from gpuledger.cli import common

GPUWORKLOAD_AGENTAFLOW = """\
# A GPUWorkload (agentaflow.io/v1, the AgentaFlow scheduler's group). Submit with `gpuledger submit FILE`;
# follow it with `gpuledger workloads` or `kubectl get gpuworkloads`.
apiVersion: agentaflow.io/v1
kind: GPUWorkload
metadata:
  name: my-training-job
  # a namespace opted in to gpuledger admission (label gpuledger.io/admission=enabled)
  namespace: default
spec:
  # higher runs first; equal priorities run oldest first
  priority: 5
  # MiB of memory each GPU must have
  gpuMemoryRequired: 8192
  # best_fit | least_utilized | round_robin | priority | ... (`gpuledger strategy` lists them);
  # left out = the cluster's default
  schedulingStrategy: best_fit
  gpuRequirements:
    gpuCount: 1
    minGPUMemory: 8192
    # false = share one GPU with other workloads
    exclusiveAccess: true
  podTemplate:
    spec:
      restartPolicy: Never
      containers:
        - name: training
          image: pytorch/pytorch:latest
          command: ["python", "train.py"]
          resources:
            limits:
              nvidia.com/gpu: 1
"""

GPUWORKLOAD_WARP = """\
# A GPUWorkload (gpu.warp.dev/v1alpha1, GPU_Orchestrator's group). Submit with `gpuledger submit FILE`.
apiVersion: gpu.warp.dev/v1alpha1
kind: GPUWorkload
metadata:
  name: my-model
  namespace: default
spec:
  modelName: llama2
  gpuCount: 2
  # low | medium | high (or an integer)
  priority: high
  # leastLoaded | random | costOptimized | bestFit | ...
  schedulingStrategy: leastLoaded
  retryPolicy:
    # attempts after the first failure; the wait doubles from backoffSeconds, with jitter
    maxRetries: 3
    backoffSeconds: 30
  image: nvcr.io/nvidia/pytorch:24.05-py3
"""

POD = """\
# A pod that gpuledger places: created in a namespace opted in to admission (label
# gpuledger.io/admission=enabled), the webhook writes its node and devices at creation.
apiVersion: v1
kind: Pod
metadata:
  name: my-gpu-pod
  namespace: default
  annotations:
    # optional: the device strategy for this pod (else the cluster's default, `gpuledger strategy`)
    agentaflow.gpu/scheduling-strategy: best_fit
    # optional: low | medium | high | critical or an integer
    agentaflow.gpu/priority: medium
    # optional: MiB (or a quantity such as 16Gi) each GPU must have
    # agentaflow.gpu/memory: 16Gi
spec:
  restartPolicy: Never
  containers:
    - name: cuda
      image: nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04
      command: ["nvidia-smi"]
      resources:
        limits:
          # whole GPUs; the webhook picks which ones
          nvidia.com/gpu: 1
"""

JOB = """\
# A Job whose pods gpuledger places (all-or-nothing when parallelism > 1), in an opted-in namespace.
apiVersion: batch/v1
kind: Job
metadata:
  name: my-gpu-job
  namespace: default
spec:
  # pods placed together as one gang
  parallelism: 1
  completions: 1
  backoffLimit: 3
  ttlSecondsAfterFinished: 3600
  template:
    metadata:
      annotations:
        agentaflow.gpu/scheduling-strategy: best_fit
    spec:
      restartPolicy: Never
      containers:
        - name: worker
          image: nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04
          command: ["nvidia-smi"]
          resources:
            limits:
              nvidia.com/gpu: 1
"""

TEMPLATES = {
    "gpuworkload": GPUWORKLOAD_AGENTAFLOW,
    "gpuworkload-warp": GPUWORKLOAD_WARP,
    "pod": POD,
    "job": JOB,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuledger generate-template", description=__doc__.splitlines()[0])
    p.add_argument("file", nargs="?", help="where to write it (default: stdout)")
    p.add_argument(
        "--kind",
        choices=sorted(TEMPLATES),
        default="gpuworkload",
        help="gpuworkload (agentaflow.io/v1, default), gpuworkload-warp (gpu.warp.dev/v1alpha1), pod, job",
    )
    p.add_argument("-n", "--namespace", help="the namespace written in the template (default: default)")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    return p


def render(kind: str, namespace: str | None = None) -> str:
    text = TEMPLATES[kind]
    return text.replace("  namespace: default\n", f"  namespace: {namespace}\n", 1) if namespace else text


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        text = render(args.kind, args.namespace)
        if not args.file or args.file == "-":
            sys.stdout.write(text)
            return common.EXIT_OK
        if os.path.exists(args.file) and not args.force:
            raise common.CommandError(
                f"{args.file} exists: not overwritten (--force to replace it)", common.EXIT_REFUSED
            )
        with open(args.file, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote a {args.kind} template to {args.file}")
        return common.EXIT_OK

    return common.run("generate-template", body)
