"""Reading the ledger's preemption words for display: the victims of a plan and the rule that allows each.

The ledger explains a pod that would wait in one line (gpuledger.core.queues.preemption.describe_plan, after
its queue's refusal when there is one): `<preemptor> preempts <n> workload(s): <victim>; <victim>...`, each
victim `<workload> (<gpus> GPU(s); <rule>: <why>)`; or `<preemptor> cannot preempt: <reason>`; or
`<preemptor> fits without preempting anything`. This splits that line into its parts, so `gpuledger
explain` can show one victim a line, and never raises on words it does not know (they are shown whole).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PREEMPTS = re.compile(r"^(?P<preemptor>\S+) preempts (?P<count>\d+) workload\(s\): (?P<victims>.+)$")
_CANNOT = re.compile(r"^(?P<preemptor>\S+) cannot preempt: (?P<reason>.+)$")
_FITS = re.compile(r"^(?P<preemptor>\S+) fits without preempting anything$")
_VICTIM = re.compile(r"^(?P<workload>\S+) \((?P<gpus>[0-9.]+) GPU\(s\); (?P<rule>[a-z]+): (?P<why>.*)\)$")


@dataclass(frozen=True)
class PlannedVictim:
    """One victim workload (a pod, or a gang whole), what it holds and the rule that allows taking it."""

    workload: str
    gpus: str
    rule: str  # reclaim, priority or critical (docs/queues.md#preemption)
    why: str


@dataclass(frozen=True)
class PreemptionView:
    """What the ledger said about a pod that would wait: its queue's refusal (if any) and its plan."""

    text: str  # the ledger's words, whole
    preemptor: str = ""
    refusal: str = ""  # the queue's refusal that came first ("" when none)
    victims: tuple[PlannedVictim, ...] = ()
    cannot: str = ""  # why it may not preempt ("" when it has a plan, fits, or the words are unknown)
    fits: bool = False  # it fits without preempting anything

    def as_dict(self) -> dict:
        return {
            "text": self.text,
            "preemptor": self.preemptor,
            "refusal": self.refusal,
            "victims": [
                {"workload": v.workload, "gpus": v.gpus, "rule": v.rule, "why": v.why} for v in self.victims
            ],
            "cannot": self.cannot,
            "fits": self.fits,
        }


def split_top(text: str, separator: str = "; ") -> list[str]:
    """`text` split at `separator` outside parentheses (a victim's own part holds one)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            i += len(separator)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts


def parse_preemption(text: str) -> PreemptionView | None:
    """The parts of the ledger's preemption words; None for no words."""
    if not text:
        return None
    parts = split_top(text)
    # the plan's words are the last part that names the preemptor; a queue's refusal may come before it
    for start in range(len(parts)):
        words = "; ".join(parts[start:])
        refusal = "; ".join(parts[:start])
        if m := _PREEMPTS.match(words):
            victims = []
            for part in split_top(m["victims"]):
                v = _VICTIM.match(part)
                if v is None:
                    break
                victims.append(PlannedVictim(v["workload"], v["gpus"], v["rule"], v["why"]))
            else:
                return PreemptionView(text, m["preemptor"], refusal, tuple(victims))
        elif m := _CANNOT.match(words):
            return PreemptionView(text, m["preemptor"], refusal, cannot=m["reason"])
        elif m := _FITS.match(words):
            return PreemptionView(text, m["preemptor"], refusal, fits=True)
    return PreemptionView(text)


def preemption_lines(view: PreemptionView) -> list[str]:
    """The plan for a terminal: a header, then one victim a line with its rule and why."""
    lines = [f"queue: {view.refusal}"] if view.refusal else []
    if view.victims:
        gpus = sum(float(v.gpus) for v in view.victims)
        total = f"{gpus:g}"
        lines.append(f"would preempt {len(view.victims)} workload(s), {total} GPU(s), for {view.preemptor}:")
        lines += [f"  {v.workload} ({v.gpus} GPU(s)): rule {v.rule}: {v.why}" for v in view.victims]
    elif view.cannot:
        lines.append(f"would not preempt: {view.cannot}")
    elif view.fits:
        lines.append("fits without preempting anything")
    elif not view.refusal:
        lines.append(f"preemption: {view.text}")
    return lines
