"""The ledger following cluster objects: node updates and removals, adoption of placements found on pods,
collisions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, Placement, Request, ReservationState
from gpuledger.names import PLACEMENT_ANNOTATION
from tests.core.core_factory import node, pod

KEY = b"objects"


def make(*objs, **config) -> Ledger:
    led = Ledger(LedgerConfig(placement_key=KEY, **config))
    for o in objs:
        led.apply_object(o, 0.0)
    return led


def test_node_update_keeps_holdings_and_unhealthy_device_is_avoided():
    led = make(node("a", 4))
    p = led.reserve(Request(id="r", gpus=1), 0.0)
    assert p.devices == (0,)
    led.apply_object(node("a", 4, devices=[{"index": i, "healthy": i != 1} for i in range(4)]), 1.0)
    n = led.index.nodes["a"]
    assert n.dev_owner[0] == "r" and n.whole_free == 2
    q = led.reserve(Request(id="q", gpus=2), 1.0)
    assert q.devices == (2, 3)


def test_cordon_takes_a_node_out_and_uncordon_brings_it_back():
    led = make(node("a", 4))
    led.apply_object(node("a", 4, unschedulable=True), 1.0)
    assert isinstance(led.reserve(Request(id="r", gpus=1), 1.0), Denial)
    led.apply_object(node("a", 4), 2.0)
    assert isinstance(led.reserve(Request(id="r", gpus=1), 2.0), Placement)


def test_removed_node_keeps_what_is_held_until_it_returns():
    led = make(node("a", 4), node("b", 4))
    p = led.reserve(Request(id="r", gpus=3), 0.0)
    led.apply_object(pod("p", placement=p, key=KEY), 0.0)
    led.delete_object(node(p.node, 4))
    assert p.node not in led.index.nodes and led.get("r") == p
    led.apply_object(node(p.node, 4), 1.0)
    assert led.index.nodes[p.node].whole_free == 1


def test_pod_seen_before_its_node_is_applied_when_the_node_arrives():
    led = make()
    placed = Placement(id="x", node="late", devices=(1,), cpu_milli=100)
    led.apply_object(pod("p", placement=placed, key=KEY), 0.0)
    led.apply_object(node("late", 2), 0.0)
    n = led.index.nodes["late"]
    assert n.dev_owner[1] == "x" and n.cpu_free == 64000 - 100


def test_pod_placement_displaces_an_unconfirmed_reservation():
    led = make(node("a", 1))
    led.reserve(Request(id="tentative", gpus=1), 0.0)
    real = Placement(id="real", node="a", devices=(0,))
    led.apply_object(pod("p", placement=real, key=KEY), 1.0)
    assert led.get("tentative") is None
    assert led.state_of("real") == ReservationState.CONFIRMED
    assert led.index.nodes["a"].dev_owner[0] == "real"


def test_colliding_confirmed_placements_count_the_second_as_unknown():
    led = make(node("a", 2))
    first = Placement(id="one", node="a", devices=(0,))
    second = Placement(id="two", node="a", devices=(0,))
    led.apply_object(pod("p1", placement=first, key=KEY), 0.0)
    led.apply_object(pod("p2", placement=second, key=KEY), 0.0)
    n = led.index.nodes["a"]
    assert n.dev_owner[0] == "one" and n.unknown_gpus == 1 and n.whole_free == 0
    assert any("collides" in msg for msg in led.problems)
    led.delete_object(pod("p2", placement=second, key=KEY))
    assert n.unknown_gpus == 0 and n.whole_free == 1


def test_pending_pod_without_node_confirms_but_holds_nothing_extra():
    led = make(node("a", 2))
    p = led.reserve(Request(id="r", gpus=1, cpu_milli=500), 0.0)
    unbound = pod("p", placement=p, key=KEY)
    del unbound["spec"]["nodeName"]
    led.apply_object(unbound, 1.0)
    assert led.state_of("r") == ReservationState.CONFIRMED
    assert led.index.nodes["a"].cpu_free == 64000 - 500


def test_foreign_pod_update_replaces_its_usage():
    led = make(node("a", 4))
    led.apply_object(pod("f", node_name="a", gpus=1, cpu="1"), 0.0)
    led.apply_object(pod("f", node_name="a", gpus=2, cpu="1"), 1.0)
    assert led.index.nodes["a"].unknown_gpus == 2
    led.apply_object(pod("f", node_name="a", gpus=2, phase="Failed"), 2.0)
    assert led.index.nodes["a"].unknown_gpus == 0 and led.index.nodes["a"].cpu_free == 64000


# --- a rebuild's common pod read straight from its object (claims.bound_claim_of_pod) ----------------------

_ODD = st.sampled_from([None, "", 0, 7, [], ["x"], {}, {"phase": "Running"}, "text"])


def _signed_pod_variants():
    """Stored pods around a validly signed placement: as written, copied elsewhere, terminal, forged, and with
    fields of every odd type the general path meets."""
    from gpuledger.core.pods.placement_codec import Binding, encode_placement

    placement = Placement(id="r1", node="n1", devices=(1,), cpu_milli=500, memory_mib=64, strategy="best_fit")
    annotations = st.sampled_from(
        [
            encode_placement(placement, KEY, Binding("ns", "p")),  # issued for this pod
            encode_placement(placement, KEY, Binding("ns", "other")),  # a copy issued for another pod
            encode_placement(placement, KEY),  # a legacy placement, bound to nothing
            encode_placement(placement, b"another key", Binding("ns", "p")),  # forged
            encode_placement(placement, KEY, Binding("ns", "p"))[:-5] + '00"}',  # tampered signature
            "not json",
        ]
    )

    @st.composite
    def build(draw):
        meta = {"name": "p", "namespace": "ns"}
        meta["annotations"] = draw(
            st.one_of(st.builds(lambda a: {PLACEMENT_ANNOTATION: a}, annotations), _ODD)
        )
        for field in ("uid", "creationTimestamp"):
            meta[field] = draw(st.one_of(st.sampled_from(["u-1", "2026-01-01T00:00:00Z"]), _ODD))
        pod = {"kind": "Pod", "metadata": draw(st.one_of(st.just(meta), _ODD))}
        spec = draw(st.one_of(st.builds(lambda n: {"nodeName": n}, st.one_of(st.just("n2"), _ODD)), _ODD))
        status = draw(st.one_of(st.sampled_from([{"phase": "Running"}, {"phase": "Succeeded"}]), _ODD))
        for field, value in (("spec", spec), ("status", status)):
            if draw(st.booleans()):
                pod[field] = value
        return pod

    return build()


@settings(max_examples=400, deadline=None)
@given(_signed_pod_variants())
def test_a_pods_bound_claim_read_directly_is_the_one_its_usage_gives(pod):
    """Where `bound_claim_of_pod` answers, it answers what the general path (`pod_usage`, then `claim_of`)
    does; where it does not (anything but a live pod carrying a placement issued for it), the general path
    reads the pod."""
    from gpuledger.core.books.claims import bound_claim_of_pod, claim_of
    from gpuledger.core.pods import objects as kube

    fast = bound_claim_of_pod(pod, KEY)
    try:
        u = kube.pod_usage(pod, KEY, [], lazy=True)
    except (TypeError, AttributeError, ValueError, KeyError, IndexError):
        assert fast is None  # malformed: the general path records it
        return
    general = (
        None
        if u.terminal
        else claim_of(u.key, u.placement, u.unbound, u.placement_problem, u.node, u.created, u.uid)
    )
    assert fast is None or fast == general
    if general is not None and general.bound and _well_typed(pod):
        assert fast == general  # the shortcut is taken for every live pod its placement was issued for


def _well_typed(pod: dict) -> bool:
    meta, spec, status = pod["metadata"], pod.get("spec"), pod.get("status")
    texts = (
        meta.get("uid"),
        meta.get("creationTimestamp"),
        (spec or {}).get("nodeName") if type(spec) is dict else "",
    )
    return (
        type(meta.get("annotations")) is dict
        and all(type(t or "") is str for t in texts)
        and (not spec or type(spec) is dict)
        and (not status or type(status) is dict)
    )


def test_the_common_stored_pod_is_read_directly():
    from gpuledger.core.books.claims import bound_claim_of_pod
    from gpuledger.core.pods.placement_codec import Binding, encode_placement

    p = Placement(id="r1", node="n1", devices=(0,))
    stored = pod(
        "p",
        node_name="n1",
        annotations={PLACEMENT_ANNOTATION: encode_placement(p, KEY, Binding("default", "p"))},
    )
    claim = bound_claim_of_pod(stored, KEY)
    assert claim is not None and claim.placement == p and claim.key == "default/p" and claim.node == "n1"


def test_a_rebuild_in_steps_pauses_every_step_and_builds_what_rebuild_builds():
    """The actor's stepped resync (gpuledger.ray.actor): the same ledger, a pause after every `step` objects
    (and `step` nodes filed and keyed at the end, and once when done), the collector paused across the
    pauses and restored when the build ends or is abandoned; a discarded ledger is freed by refcounting."""
    import gc

    nodes = [node(f"n{i}", 4) for i in range(5)]
    placed = [Placement(id=f"r{i}", node=f"n{i}", devices=(i % 4,), cpu_milli=100) for i in range(5)]
    objects = [*nodes, *(pod(f"p{i}", placement=p, key=KEY) for i, p in enumerate(placed))]
    whole = Ledger.rebuild(objects, LedgerConfig(placement_key=KEY))
    steps = Ledger.rebuild_in_steps(objects, LedgerConfig(placement_key=KEY), step=3)
    pauses = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            stepped = done.value
            break
        pauses += 1
        assert not gc.isenabled()
    # objects applied, nodes filed, nodes keyed into classes; then the load is done, the collector not resumed
    assert pauses == len(objects) // 3 + 2 * (len(nodes) // 3) + 1 and gc.isenabled()
    assert stepped.snapshot() == whole.snapshot() and set(stepped.reservations()) == {p.id for p in placed}
    abandoned = Ledger.rebuild_in_steps(objects, LedgerConfig(placement_key=KEY), step=2)
    next(abandoned)
    abandoned.close()
    assert gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        stepped.reserve(Request(id="more", gpus=2), 1.0)
        for _ in stepped.discard_in_steps(1):
            pass
        whole.discard()
        del stepped, whole
        assert gc.collect() == 0
    finally:
        gc.enable()


def _generation_of(obj: object) -> int | None:
    import gc

    for generation in range(3):
        if any(o is obj for o in gc.get_objects(generation)):
            return generation
    return None


def test_a_rebuilt_ledger_is_in_the_collectors_oldest_generation_and_nothing_stays_frozen():
    """A bulk load's objects live as long as the ledger: when the collector is resumed they are already in
    its oldest generation, so no young collection walks them; nothing is left frozen. Something a caller
    froze stays frozen (the ledger actor freezes between steps; it leaves nothing young)."""
    import gc

    nodes = [node(f"n{i}", 4) for i in range(3)]
    placed = [Placement(id=f"r{i}", node=f"n{i}", devices=(i % 4,), cpu_milli=100) for i in range(3)]
    objects = [*nodes, *(pod(f"p{i}", placement=p, key=KEY) for i, p in enumerate(placed))]
    gc.unfreeze()  # what an earlier test in this process froze (a ledger actor, `tune_gc`)
    led = Ledger.rebuild(objects, LedgerConfig(placement_key=KEY))
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert _generation_of(led._books) == 2 and _generation_of(led._books.reservations) == 2
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        again = Ledger.rebuild(objects, LedgerConfig(placement_key=KEY))
        assert gc.get_freeze_count() == frozen  # nothing the caller froze was thawed
        assert again.snapshot() == led.snapshot()
    finally:
        gc.unfreeze()
    assert gc.isenabled()


def test_a_stepped_rebuild_leaves_the_collectors_generations_to_its_caller(monkeypatch):
    """Counting what is frozen walks all of it (~0.7 s once the ledger actor has frozen a 500,000-pod
    ledger), so only a plain rebuild asks; a stepped one's caller freezes at its last pause if it wants to."""
    import gc

    from gpuledger.core.steps import drain

    asked: list[int] = []
    real = gc.get_freeze_count

    def counted() -> int:
        asked.append(1)
        return real()

    monkeypatch.setattr(gc, "get_freeze_count", counted)
    objects = [node("n0", 4), pod("p0", placement=Placement(id="r0", node="n0", devices=(1,)), key=KEY)]
    stepped = drain(Ledger.rebuild_in_steps(objects, LedgerConfig(placement_key=KEY), step=1))
    assert asked == [] and gc.isenabled()
    plain = Ledger.rebuild(objects, LedgerConfig(placement_key=KEY))
    assert asked == [1] and plain.snapshot() == stepped.snapshot()


def test_discarding_a_ledger_leaves_another_with_the_same_config_and_strategies_whole():
    """What two ledgers share (their config, the registered strategies) is left as it is by `discard`: the
    other ledger decides, explains and snapshots as before."""
    config = LedgerConfig(placement_key=KEY)
    objects = [node(f"n{i}", 4) for i in range(6)]
    kept, dropped = Ledger.rebuild(objects, config), Ledger.rebuild(objects, config)
    for i, strategy in enumerate(("best_fit", "fgd_host", "balanced", "distributed", "consolidated")):
        for led in (kept, dropped):
            assert isinstance(led.reserve(Request(id=f"r{i}", gpus=1, strategy=strategy), 0.0), Placement)
    before = kept.snapshot()
    for _ in dropped.discard_in_steps(1):
        pass
    assert kept.snapshot() == before
    assert isinstance(kept.reserve(Request(id="after", gpus=2, strategy="fgd_host"), 1.0), Placement)
    assert isinstance(kept.explain(Request(id="big", gpus=9)).result, Denial)
