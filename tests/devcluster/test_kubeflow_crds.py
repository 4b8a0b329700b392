"""The test control plane's Kubeflow CRDs cover every kubeflow.org kind the webhook reads, as the API
serves it."""

from __future__ import annotations

from devcluster import kubeflow
from gpuledger.webhook.admission.owners import WORKLOAD_KINDS


def test_every_kubeflow_kind_the_webhook_reads_has_a_crd():
    read = {kind: w for kind, w in WORKLOAD_KINDS.items() if w.group == kubeflow.GROUP}
    assert set(read) == set(kubeflow.KINDS) == {"PyTorchJob", "MPIJob", "TFJob"}
    for crd in kubeflow.crds():
        names, [version] = crd["spec"]["names"], crd["spec"]["versions"]
        kind = names["kind"]
        assert (crd["spec"]["group"], version["name"], names["plural"]) == (
            read[kind].group,
            read[kind].version,
            read[kind].plural,
        )
        assert crd["metadata"]["name"] == f"{names['plural']}.{kubeflow.GROUP}"
        assert version["schema"]["openAPIV3Schema"]["x-kubernetes-preserve-unknown-fields"] is True
        assert version["served"] and version["storage"] and crd["spec"]["scope"] == "Namespaced"
