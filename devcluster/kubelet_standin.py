"""The kubelet's part for a cluster whose nodes have no kubelet (the sample GPU nodes), and a record of the
Eviction API's acts.

Without it a bound pod stays Pending for ever, and a pod deleted with a grace period stays Terminating until
its node's kubelet says the containers stopped, which never comes: preemption's victims would never be gone.
The demo and the queue tests run it beside kube-scheduler; the real node's tests run the real kubelet instead.
"""

from __future__ import annotations

import threading
import time


class KubeletStandIn:
    """The kubelet's part, for a cluster without one, and a record of the Eviction API's acts.

    A watch on every pod: a pod bound to a node is started (status Running and Ready, its startTime now,
    as its kubelet reports once the containers run: PodDisruptionBudgets count Ready pods as healthy); a
    terminating pod bound to a node is deleted with grace 0 (what its kubelet does once the containers
    stopped), unless paused (the victims stay Terminating: not gone yet); a pod carrying the DisruptionTarget
    condition the Eviction API writes (reason EvictionByEvictionAPI) is recorded as evicted."""

    def __init__(self, cp):
        self.cp = cp
        self.evicted: dict[str, str] = {}  # "namespace/name" -> uid, every pod the Eviction API evicted
        self.finished: list[str] = []  # terminating pods whose deletion this finished
        self._started: set[str] = set()  # uids of the pods this reported running
        self._running = threading.Event()  # set: finish deletions; clear: leave them Terminating
        self._running.set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="kubelet-stand-in", daemon=True)

    def start(self) -> KubeletStandIn:
        from kubernetes import client

        self.core = client.CoreV1Api(self.cp.api_client())
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=40)

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()
        for pod in self.core.list_pod_for_all_namespaces().to_dict()["items"]:
            self._seen(pod)

    def evicted_in(self, *namespaces: str) -> dict[str, str]:
        with self._lock:
            return {k: v for k, v in self.evicted.items() if k.split("/", 1)[0] in namespaces}

    def _loop(self) -> None:
        import urllib3
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        while not self._stop.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces()
                for pod in listed.to_dict()["items"]:
                    self._seen(pod)
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=listed.metadata.resource_version if listed.metadata else None,
                    timeout_seconds=5,
                )
                for event in stream:
                    self._seen(event["object"].to_dict())
                    if self._stop.is_set():
                        return
            except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError):  # dropped: again
                time.sleep(0.2)

    def _seen(self, pod: dict) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        key = f"{meta['namespace']}/{meta['name']}"
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(
            c.get("type") == "DisruptionTarget" and c.get("reason") == "EvictionByEvictionAPI"
            for c in conditions
        ):
            with self._lock:
                self.evicted[key] = meta["uid"]
        if not spec.get("node_name"):
            return
        from kubernetes.client.exceptions import ApiException

        if meta.get("deletion_timestamp"):
            if self._running.is_set():
                try:
                    self.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0)
                    self.finished.append(key)
                except ApiException as err:
                    if err.status != 404:
                        raise
        elif meta["uid"] not in self._started and (pod.get("status") or {}).get("phase") == "Pending":
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            ready = [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("Initialized", "ContainersReady", "Ready")
            ]
            body = {"status": {"phase": "Running", "startTime": now, "conditions": ready}}
            try:
                self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)
                self._started.add(meta["uid"])
            except ApiException as err:
                if err.status not in (404, 409):
                    raise
