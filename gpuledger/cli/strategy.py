"""`gpuledger strategy [NAME]`: show or change the live default strategy.

The change is a patch of `default_strategy` in the gpuledger ConfigMap (comments and other keys kept); each
webhook replica's config reload (gpuledger/webhook/config_watch.py) pushes it to the shared ledger, so
nothing restarts.
Never talks to the ledger directly: the ConfigMap stays the one place the setting lives.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

import yaml

from gpuledger.cli import common
from gpuledger.cli.kube import Kube

DEFAULT_SYSTEM_NAMESPACE = "gpuledger-system"
SYSTEM_NAMESPACE_ENV = "GPULEDGER_NAMESPACE"
DEPLOYMENT = "gpuledger"
CONFIG_VOLUME = "config"
CONFIG_PREFIX = "gpuledger-config"
CONFIG_KEY = "config.yaml"
STRATEGY_KEY = "default_strategy"
STRATEGY_ENV = "SCHEDULING_STRATEGY"  # overrides the file (gpuledger.webhook.config.STRATEGY_ENV)
# the webhook's loader's default (WebhookConfig.default_strategy) and the ledger's own (LedgerSettings): what
# the ledger uses when no ConfigMap and no SCHEDULING_STRATEGY names another
BUILTIN_DEFAULT = "fgd_host"
_LINE = re.compile(r"^default_strategy\s*:.*$", re.M)


def build_parser() -> argparse.ArgumentParser:
    p = common.parser(
        "strategy", "Show the default strategy, or change it in the live ledger.", namespaced=False
    )
    p.add_argument(
        "name", nargs="?", help="the new default strategy (e.g. best_fit, least_utilized, priority)"
    )
    p.add_argument(
        "--system-namespace",
        default=None,
        help=f"where gpuledger runs (default ${SYSTEM_NAMESPACE_ENV} or {DEFAULT_SYSTEM_NAMESPACE})",
    )
    return p


def system_namespace(flag: str | None) -> str:
    return flag or os.environ.get(SYSTEM_NAMESPACE_ENV) or DEFAULT_SYSTEM_NAMESPACE


def find_config_map(kube: Kube, namespace_flag: str | None) -> tuple[dict, dict | None]:
    """(the ConfigMap the webhook mounts, its Deployment or None). The name carries kustomize's hash, so it is
    read from the Deployment's `config` volume, else the newest gpuledger-config* ConfigMap."""
    namespace = system_namespace(namespace_flag)
    deployment = kube.read("apps/v1", "Deployment", DEPLOYMENT, namespace)
    if deployment is not None:
        for volume in deployment["spec"]["template"]["spec"].get("volumes") or ():
            if volume.get("name") == CONFIG_VOLUME and volume.get("configMap"):
                cm = kube.read("v1", "ConfigMap", volume["configMap"]["name"], namespace)
                if cm is not None:
                    return cm, deployment
    candidates = [
        cm for cm in kube.config_maps(namespace) if cm["metadata"]["name"].startswith(CONFIG_PREFIX)
    ]
    if not candidates:
        raise common.CommandError(
            f"no gpuledger ConfigMap in namespace {namespace} (a Deployment {DEPLOYMENT} "
            f"mounting one, or a ConfigMap named {CONFIG_PREFIX}*): is gpuledger installed "
            f"there? (--system-namespace)",
            common.EXIT_NOT_FOUND,
        )
    newest = max(candidates, key=lambda cm: cm["metadata"].get("creationTimestamp", ""))
    return newest, deployment


def config_entry(cm: dict) -> tuple[str, str]:
    data = cm.get("data") or {}
    if CONFIG_KEY in data:
        return CONFIG_KEY, data[CONFIG_KEY]
    if len(data) == 1:
        ((key, text),) = data.items()
        return key, text
    raise common.CommandError(
        f"ConfigMap {cm['metadata']['name']}: expected a data key {CONFIG_KEY}, found "
        f"{', '.join(sorted(data)) or 'none'}",
        common.EXIT_NOT_FOUND,
    )


def env_override(deployment: dict | None) -> str:
    """SCHEDULING_STRATEGY on the webhook container, which wins over the file at every reload."""
    for container in (
        (deployment or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", ())
    ):
        for env in container.get("env") or ():
            if env.get("name") == STRATEGY_ENV and env.get("value"):
                return str(env["value"])
    return ""


def current_strategy(kube: Kube, found: tuple[dict, dict | None]) -> dict[str, Any]:
    cm, deployment = found
    key, text = config_entry(cm)
    configured = (yaml.safe_load(text) or {}).get(STRATEGY_KEY) or BUILTIN_DEFAULT
    override = env_override(deployment)
    meta = cm["metadata"]
    return {
        "configured": configured,
        "environment": override or None,
        "effective": override or configured,
        "configMap": f"{meta['namespace']}/{meta['name']}",
        "key": key,
        "source": f"{STRATEGY_ENV} on Deployment {DEPLOYMENT}"
        if override
        else f"ConfigMap {meta['namespace']}/{meta['name']}",
    }


def live_default(kube: Kube, namespace_flag: str | None) -> dict[str, Any]:
    """The default strategy the ledger uses and where it comes from, as the webhook's loader resolves it:
    SCHEDULING_STRATEGY on the Deployment, else the ConfigMap's `default_strategy`, else the built-in
    default. Without a gpuledger ConfigMap (a ledger started with no config file, as the dev cluster's) that
    is the Deployment's variable or the built-in default, the source saying so. A KubeError when the
    ConfigMap or Deployment cannot be read (e.g. forbidden): then nothing can be said."""
    try:
        return current_strategy(kube, find_config_map(kube, namespace_flag))
    except common.CommandError as exc:
        if exc.code != common.EXIT_NOT_FOUND:
            raise
    namespace = system_namespace(namespace_flag)
    override = env_override(kube.read("apps/v1", "Deployment", DEPLOYMENT, namespace))
    return {
        "configured": None,
        "environment": override or None,
        "effective": override or BUILTIN_DEFAULT,
        "configMap": None,
        "key": None,
        "source": f"{STRATEGY_ENV} on Deployment {DEPLOYMENT}"
        if override
        else f"built-in default: no gpuledger ConfigMap in {namespace} sets another",
    }


def with_strategy(text: str, name: str) -> str:
    """The config text with `default_strategy: name`, comments and every other line unchanged."""
    if _LINE.search(text):
        return _LINE.sub(f"{STRATEGY_KEY}: {name}", text, count=1)
    return text.rstrip("\n") + f"\n{STRATEGY_KEY}: {name}\n"


def canonical(name: str) -> str:
    """The registered name of `name` (aliases accepted), or a usage error listing the accepted names."""
    from gpuledger.service.settings import check_strategy

    try:
        return check_strategy(name, "strategy")
    except ValueError as exc:
        raise common.CommandError(str(exc), common.EXIT_USAGE) from exc


def validate(text: str) -> None:
    """The webhook's own loader must accept the edited file, or it would keep the old settings."""
    from gpuledger.webhook.config import WebhookConfig

    try:
        WebhookConfig.from_document(yaml.safe_load(text) or {}, "edited config")
    except (ValueError, TypeError) as exc:
        raise common.CommandError(f"the edited config would not load: {exc}", common.EXIT_USAGE) from exc


def strategy_names() -> list[str]:
    from gpuledger.service.settings import strategy_names as names

    return list(names())


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        kube = common.connect(args)
        found = find_config_map(kube, args.system_namespace)
        before = current_strategy(kube, found)
        if args.name is None:
            data = {**before, "available": strategy_names()}
            common.emit(
                args,
                data,
                common.table(
                    ["strategy", "source", "available"],
                    [[before["effective"], before["source"], " ".join(data["available"])]],
                ),
            )
            return common.EXIT_OK
        name = canonical(args.name)
        cm, _ = found
        key, text = config_entry(cm)
        edited = with_strategy(text, name)
        validate(edited)
        meta = cm["metadata"]
        # resourceVersion makes the patch fail (409) rather than overwrite a concurrent edit
        kube.patch_config_map(
            meta["name"],
            meta["namespace"],
            {"metadata": {"resourceVersion": meta["resourceVersion"]}, "data": {key: edited}},
        )
        after = {
            **before,
            "configured": name,
            "effective": before["environment"] or name,
            "previous": before["configured"],
        }
        common.emit(
            args,
            after,
            f"default strategy: {before['configured']} -> {name} "
            f"(ConfigMap {after['configMap']}); each webhook replica pushes it to the ledger "
            "once the kubelet refreshes the mounted file",
        )
        if before["environment"]:
            common.warn(
                "strategy",
                f"{STRATEGY_ENV}={before['environment']} on Deployment {DEPLOYMENT} overrides the file; "
                f"the live strategy stays {before['environment']}",
            )
        return common.EXIT_OK

    return common.run("strategy", body)
