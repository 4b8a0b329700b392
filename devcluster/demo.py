"""`gpuledger demo`: a local control plane, the webhook with a local Ray ledger, a sample GPU cluster, and
today's story in three parts: (1) sample workloads applied with kubectl, and a table of where each pod went
and why; (2) a full cluster, where pods wait in one line and start in order; (3) two teams' GPUQueues and a
reclaim, shown by `gpuledger explain` before it happens. The cluster runs kube-scheduler, the disruption
controller and a kubelet stand-in for the sample nodes (devcluster/kubelet_standin.py).

With `--use-current-kubeconfig` it talks to the cluster of the current kubeconfig instead: if gpuledger's
webhook configurations are installed there it uses them as they are; otherwise it runs the webhook here and
registers it at https://WEBHOOK_HOST:PORT (reachable from that API server only if it runs on this machine or
WEBHOOK_HOST routes here). Fake GPU nodes are created there only with `--sample-nodes`; only the first part
runs there (the others need the sample nodes' kubelet stand-in, which plays the kubelet of every node).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from devcluster.binaries import ControlPlaneError, missing_binaries
from devcluster.cluster import CONTROLLERS, ControlPlane
from devcluster.demo_line import run_line
from devcluster.demo_queues import run_queues
from devcluster.demo_shell import DemoShell, empty_namespace, wait
from devcluster.kubeclient import ExistingCluster, KubeClient
from devcluster.kubelet_standin import KubeletStandIn
from devcluster.nodes import LEAF_LABEL, SPINE_LABEL, create_nodes, make_sample_cluster
from devcluster.scheduler import KubeScheduler, scheduler_binary
from devcluster.users import ALICE
from gpuledger.names import MUTATING_CONFIG

IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"


def _pod(name: str, annotations: dict | None = None, gpus: int | None = 1, **spec) -> dict:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"demo": name}, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "cuda", "image": IMAGE, "resources": resources}], **spec},
    }


def _template(labels: dict, gpus: int | None = None) -> dict:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "metadata": {"labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "w", "image": IMAGE, "resources": resources}],
        },
    }


def sample_workloads() -> list[tuple[str, dict]]:
    """(what it shows, object): each applied on its own so a denial is reported next to its workload."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "allreduce", "annotations": {"topology.scheduler/gpu-count": "16"}},
        "spec": {
            "parallelism": 4,
            "completions": 4,
            "completionMode": "Indexed",
            "template": _template({"demo": "allreduce"}),
        },
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "inference"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"demo": "inference"}},
            "template": {
                "metadata": {
                    "labels": {"demo": "inference"},
                    "annotations": {"agentaflow.gpu/scheduling-strategy": "round_robin"},
                },
                "spec": {
                    "containers": [
                        {"name": "triton", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ]
                },
            },
        },
    }
    return [
        ("2 GPUs, default strategy (fgd_host)", _pod("train-small", gpus=2)),
        ("1 GPU, least-loaded", _pod("notebook", {"agentaflow.gpu/scheduling-strategy": "least-loaded"})),
        (
            "4 GPUs, distributed: emptiest leaf",
            _pod("eval", {"topology.scheduler/placement-strategy": "distributed"}, gpus=4),
        ),
        (
            "half a GPU, shared",
            _pod(
                "shared",
                {"agentaflow.gpu/exclusive-access": "false", "agentaflow.gpu/milli": "500"},
                gpus=None,
            ),
        ),
        (
            "tainted node: toleration added",
            _pod("on-tainted", nodeSelector={"kubernetes.io/hostname": "leaf-2-node-3"}),
        ),
        ("H100 only", _pod("h100", {"agentaflow.gpu/product": "H100"}, gpus=2)),
        ("Job gang: 16 GPUs over 4 pods, one leaf", job),
        ("Deployment, round robin", deployment),
        ("too big for any node", _pod("too-big", gpus=16)),
        ("a typo in an annotation", _pod("typo", {"agentaflow.gpu/scheduling-strategy": "fastest"})),
    ]


@dataclass
class Row:
    pod: str
    what: str
    node: str = "-"
    leaf: str = "-"
    spine: str = "-"
    devices: str = "-"
    why: str = ""


def _placement_text(placement) -> tuple[str, str]:
    if placement.devices:
        devices = ",".join(map(str, placement.devices))
    else:
        devices = ",".join(f"{s.device}({s.milli}m)" for s in placement.shares)
    why = f"{placement.strategy or 'default'} score {placement.score:g}"
    if placement.group:
        why += f"; gang {placement.group} slot {placement.slot}"
    if placement.tolerated_taints:
        why += "; tolerates " + ",".join(f"{t.key}={t.value}:{t.effect}" for t in placement.tolerated_taints)
    return devices, why


def _denial_text(stderr: str) -> str:
    text = stderr.strip().splitlines()[-1] if stderr.strip() else "denied"
    marker = "denied the request: "
    return "DENIED: " + (text.split(marker, 1)[1] if marker in text else text)


def print_table(rows: list[Row], out=sys.stdout) -> None:
    headers = ("POD", "WORKLOAD", "NODE", "LEAF", "SPINE", "GPUS", "WHY")
    data = [(r.pod, r.what, r.node, r.leaf, r.spine, r.devices, r.why) for r in rows]
    widths = [max(len(h), *(len(d[i]) for d in data)) if data else len(h) for i, h in enumerate(headers[:-1])]
    line = "  ".join(h.ljust(w) for h, w in zip(headers[:-1], widths, strict=True)) + "  " + headers[-1]
    print(line, file=out)
    for d in data:
        print("  ".join(v.ljust(w) for v, w in zip(d[:-1], widths, strict=True)) + "  " + d[-1], file=out)


def run_workloads(kube: KubeClient, namespace: str, key: bytes, user: str | None) -> list[Row]:
    from gpuledger.core.pods.placement_codec import decode_placement
    from gpuledger.names import PLACEMENT_ANNOTATION

    nodes = {
        n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in kube.get_json("nodes")["items"]
    }
    rows: list[Row] = []
    expected: dict[str, tuple[str, int]] = {}
    for what, obj in sample_workloads():
        proc = kube.kubectl(
            "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj), as_user=user, check=False
        )
        name = obj["metadata"]["name"]
        if proc.returncode != 0:
            rows.append(Row(name, what, why=_denial_text(proc.stderr)))
        elif obj["kind"] == "Pod":
            expected[name] = (what, 1)
        else:
            count = obj["spec"].get("parallelism") or obj["spec"].get("replicas") or 1
            expected[name] = (what, count)
    # controllers create the workloads' pods; wait until each workload has its pods (or gave up on them)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pods = kube.pods(namespace)
        have = {
            k: sum(1 for p in pods if (p["metadata"].get("labels") or {}).get("demo") == k) for k in expected
        }
        if all(have[k] >= n for k, (_, n) in expected.items()):
            break
        time.sleep(0.5)
    pods = sorted(kube.pods(namespace), key=lambda p: p["metadata"]["name"])
    for pod in pods:
        meta = pod["metadata"]
        group = (meta.get("labels") or {}).get("demo", meta["name"])
        what = expected.get(group, ("", 0))[0]
        text = (meta.get("annotations") or {}).get(PLACEMENT_ANNOTATION)
        placement = decode_placement(text, key) if text and key else None
        if placement is None:
            rows.append(
                Row(
                    meta["name"],
                    what,
                    why="admitted without a placement"
                    if not text
                    else "placement present (signed with a key this demo does not hold)",
                )
            )
            continue
        labels = nodes.get(placement.node, {})
        devices, why = _placement_text(placement)
        rows.append(
            Row(
                meta["name"],
                what,
                placement.node,
                labels.get(LEAF_LABEL, "-"),
                labels.get(SPINE_LABEL, "-"),
                devices,
                why,
            )
        )
    # denied workloads whose controller could not create pods (e.g. a Job with a typo) show their events
    for name, (what, _) in expected.items():
        if not any((p["metadata"].get("labels") or {}).get("demo") == name for p in pods):
            events = kube.kubectl(
                "get",
                "events",
                "-n",
                namespace,
                "--field-selector",
                f"involvedObject.name={name}",
                "-o",
                "jsonpath={.items[-1:].message}",
                check=False,
            ).stdout
            rows.append(
                Row(name, what, why="no pods: " + (events.strip() or "the controller created none yet"))
            )
    return rows


def print_ledger(stack) -> None:
    stats = stack.call("stats")
    print(
        f"\nledger: {stats.nodes} nodes, "
        f"{stats.milli_allocated / 1000:g} of {stats.milli_total / 1000:g} GPUs allocated, "
        f"{stats.reservations_confirmed} confirmed / {stats.reservations_pending} pending reservations"
    )
    for leaf in stats.leaves:
        print(
            f"  {leaf.spine}/{leaf.leaf}: {leaf.nodes} nodes, {leaf.whole_free} whole GPUs free, "
            f"utilization {leaf.utilization:.0%}, fragmentation {leaf.fragmentation:.0%}"
        )


def wait_bound_as_placed(kube: KubeClient, stack, namespace: str) -> int:
    """Until every pod with a placement is bound to its placement's node (kube-scheduler does it, honouring
    the node affinity the webhook wrote); how many there are."""

    def bound() -> int | None:
        pods = [(p, stack.placement(p)) for p in kube.pods(namespace)]
        placed = [(p, placement) for p, placement in pods if placement is not None]
        return len(placed) if all(p["spec"].get("nodeName") == pl.node for p, pl in placed) else None

    return wait(
        kube,
        bound,
        "every placed pod bound to its node",
        pods=lambda: [(p["metadata"]["name"], p["spec"].get("nodeName")) for p in kube.pods(namespace)],
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuledger demo", description=__doc__.splitlines()[0])
    p.add_argument("--keep-running", action="store_true", help="leave everything running until Ctrl-C")
    p.add_argument(
        "--use-current-kubeconfig",
        action="store_true",
        help="use the current kubeconfig's cluster instead of starting a local control plane",
    )
    p.add_argument("--kubeconfig", help="with --use-current-kubeconfig: this file instead of $KUBECONFIG")
    p.add_argument(
        "--sample-nodes",
        action="store_true",
        help="with --use-current-kubeconfig: create the fake GPU nodes there too",
    )
    p.add_argument(
        "--webhook-host",
        default="127.0.0.1",
        help="with --use-current-kubeconfig and no installed webhook: the address the API server "
        "reaches this machine's webhook at",
    )
    p.add_argument("--namespace", default="gpuledger-demo")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from devcluster.stack import Stack

    cp: ControlPlane | None = None
    stack = None
    scheduler: KubeScheduler | None = None
    kubelet: KubeletStandIn | None = None
    kube: KubeClient
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="gpuledger-demo-"))
    try:
        if args.use_current_kubeconfig:
            kube = ExistingCluster(args.kubeconfig)
            print(f"using the cluster of {kube.kubeconfig}")
            installed = (
                kube.kubectl("get", "mutatingwebhookconfiguration", MUTATING_CONFIG, check=False).returncode
                == 0
            )
            if args.sample_nodes:
                existing = {n["metadata"]["name"] for n in kube.get_json("nodes")["items"]}
                create_nodes(
                    kube.api_client(),
                    [n for n in make_sample_cluster() if n["metadata"]["name"] not in existing],
                )
            user = None
        else:
            missing = missing_binaries() + [str(b) for b in (scheduler_binary(),) if not b.exists()]
            if missing:
                print(
                    f"gpuledger demo: missing {', '.join(missing)}; build them with `make apiserver`",
                    file=sys.stderr,
                )
                return 2
            print(
                "starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler on 127.0.0.1 ...",
                flush=True,
            )
            # the disruption controller keeps PodDisruptionBudgets' status, which reclaims respect
            cp = kube = ControlPlane(controllers=(*CONTROLLERS, "disruption-controller")).start()
            scheduler = KubeScheduler(cp).start()
            print(f"  API server {cp.url}")
            create_nodes(cp.api_client(), make_sample_cluster())
            kubelet = KubeletStandIn(cp).start()
            print(
                "  16 GPU nodes x 8 GPUs: spines spine-0 (A100) and spine-1 (H100), leaves leaf-0..leaf-3; "
                "node-3 of each leaf tainted nvidia.com/gpu=true:NoSchedule;\n"
                "  a kubelet stand-in reports their bound pods running and ends the terminating ones"
            )
            installed, user = False, ALICE
        key = b""
        if not installed:
            print("starting Ray, the ledger actor, the cluster sync and the TLS webhook ...", flush=True)
            stack = Stack(
                kube, webhook_host=args.webhook_host if args.use_current_kubeconfig else "127.0.0.1"
            )
            stack.start()
            key = stack.config.placement_key()
            print(f"  webhook {stack.url}, registered for namespaces labelled gpuledger.io/admission=enabled")
        else:
            print(
                "  gpuledger's webhook is installed in this cluster: using it (placements are shown "
                "when this demo can verify them, i.e. never: the key stays in the cluster)"
            )
        kube.create_namespace(args.namespace, users=(ALICE,) if cp else ())
        shell = DemoShell(kube, workdir)
        print(
            f"\nTo run the commands shown below yourself (with --keep-running):\n"
            f"  export KUBECONFIG={kube.kubeconfig}; cd {workdir}   # the manifests are there"
        )
        shell.heading(
            1,
            "Placement: where each pod goes, and why",
            f"Sample workloads applied in namespace {args.namespace} with kubectl"
            f"{' as user alice' if user else ''}; the webhook answers each pod with its node and GPUs.",
        )
        rows = run_workloads(kube, args.namespace, key, user)
        print_table(rows)
        if stack is not None:
            print_ledger(stack)
        if cp is not None and stack is not None and kubelet is not None:
            bound = wait_bound_as_placed(cp, stack, args.namespace)
            print(
                f"\nkube-scheduler bound each of the {bound} placed pods to the node the ledger chose:\n"
                f"$ kubectl get pods -n {args.namespace} -o wide"
            )
            empty_namespace(cp, stack, args.namespace)
            run_line(cp, stack, shell, args.namespace)
            run_queues(cp, stack, shell, kubelet)
        else:
            print("\n(parts 2 and 3 run on the demo's own control plane: `gpuledger demo` without flags)")
        print(f"\ndone in {time.monotonic() - started:.0f}s")
        if args.keep_running:
            print(
                f"\nkeeping it running; try:\n  export KUBECONFIG={kube.kubeconfig}\n"
                f"  kubectl get pods -A -o wide\n  gpuledger queues\nCtrl-C to stop.",
                flush=True,
            )
            stop = threading.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C, or `kill` from a script
                signal.signal(sig, lambda *_: stop.set())
            while not stop.wait(1.0):
                pass
            print("stopping ...", flush=True)
        return 0
    except (ControlPlaneError, OSError, TimeoutError) as exc:
        print(f"gpuledger demo: {exc}", file=sys.stderr)
        return 1
    finally:
        if kubelet is not None:
            kubelet.stop()
        if stack is not None:
            stack.stop()
        if scheduler is not None:
            scheduler.stop()
        if args.use_current_kubeconfig and not args.keep_running:
            kube.kubectl(
                "delete", "namespace", args.namespace, "--wait=false", "--ignore-not-found", check=False
            )
        if cp is not None:
            cp.stop()


if __name__ == "__main__":
    raise SystemExit(main())
