"""The test registrations differ from the shipped ones (manifests/webhooks.yaml) only where they must."""

from __future__ import annotations

import base64
import copy

from devcluster.webhooks import manifest_configurations, webhook_configurations

# url instead of a Service, our own caBundle; timeoutSeconds is the harness's (loaded 2-core machines)
HARNESS_ONLY = ("clientConfig", "timeoutSeconds")


def comparable(configs: list[dict]) -> dict:
    out = {}
    for config in configs:
        config = copy.deepcopy(config)
        hooks = []
        for hook in config["webhooks"]:
            hooks.append({k: v for k, v in hook.items() if k not in HARNESS_ONLY})
        out[(config["kind"], config["metadata"]["name"])] = hooks
    return out


def test_registrations_match_the_manifests_except_how_the_webhook_is_reached():
    ours = webhook_configurations("https://127.0.0.1:9443", b"-----BEGIN CERTIFICATE-----\n", "Fail", 5)
    assert comparable(ours) == comparable(manifest_configurations())


def test_url_client_config_and_ca_bundle():
    ours = webhook_configurations("https://127.0.0.1:9443", b"PEM", "Ignore", 7)
    hooks = [h for c in ours for h in c["webhooks"]]
    assert [h["clientConfig"]["url"] for h in hooks] == [
        "https://127.0.0.1:9443/mutate",
        "https://127.0.0.1:9443/validate",
    ]
    assert all(base64.b64decode(h["clientConfig"]["caBundle"]) == b"PEM" for h in hooks)
    assert all(h["failurePolicy"] == "Ignore" and h["timeoutSeconds"] == 7 for h in hooks)
    assert all(h["sideEffects"] == "NoneOnDryRun" for h in hooks)
