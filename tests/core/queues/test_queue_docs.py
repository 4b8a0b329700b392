"""The GPUQueue examples in docs/queues.md are queues gpuledger reads as the text says."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpuledger.core.model import MILLI_PER_GPU
from gpuledger.core.queues.gpu_queues import ANY_PRODUCT, QueueSet, queue_from_object
from gpuledger.core.queues.quotas import Capacity, ProductCapacity, Usage, Use, quota_refusal

DOC = Path(__file__).resolve().parents[3] / "docs" / "queues.md"
G = MILLI_PER_GPU


def examples() -> list[QueueSet]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    sets = []
    for block in blocks:
        docs = [d for d in yaml.safe_load_all(block) if d and d.get("kind") == "GPUQueue"]
        if docs:
            sets.append(QueueSet(queue_from_object(d) for d in docs))
    return sets


def test_every_example_is_read():
    teams, tree = examples()
    assert teams.leaves() == ["default", "team-a", "team-b"]
    assert tree.children == {"research": ("research-speech", "research-vision")}
    assert tree.default == "batch"
    assert tree.queue_of("ns", {"group": "multimodal"}) == "research-vision"
    assert tree["research-speech"].bucket("NVIDIA-A100-SXM4-80GB") == ANY_PRODUCT
    assert tree["research-vision"].bucket("NVIDIA-A100-SXM4-80GB") == "NVIDIA-A100-SXM4-80GB"  # no quota
    assert tree["research-speech"].preemption.critical_across_queues


def test_team_a_may_run_96_while_team_b_keeps_32_free():
    teams, _ = examples()
    cap = Capacity({"H100": ProductCapacity(128 * G, 128 * G, 0, 0)})
    usage = Usage(teams)
    assert quota_refusal(teams, usage, cap, "team-a", Use((("H100", 96 * G, 0, 0),))) is None
    assert quota_refusal(teams, usage, cap, "team-a", Use((("H100", 97 * G, 0, 0),))) is not None
    assert teams["team-b"].preemption.min_run_s == 600
