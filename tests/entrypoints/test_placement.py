"""Placement groups: the learner ranks, V's ranks and each rollout engine go into groups of their own, reserved
before any actor starts; a placement the cluster cannot hold is refused naming the role and the setting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pcl.config import load_config
from pcl.engines.vllm import executor_backend
from pcl.tools.placement import CPU_BUNDLE_CPUS, placement_plan

RUN = "placement-test"


def test_the_8b_preset_asks_for_packed_ranks_and_one_node_per_engine():
    cfg = load_config("configs/presets/qwen3-8b-base-math.yaml")
    groups = {g.role: g for g in placement_plan(cfg)}
    assert groups["learner"].strategy == "PACK" and groups["learner"].bundles == ({"GPU": 1.0},) * 4
    assert groups["value"].strategy == "PACK" and len(groups["value"].bundles) == 4
    engines = [g for role, g in groups.items() if role.startswith("rollout-")]
    assert len(engines) == 4 and all(g.strategy == "STRICT_PACK" and g.bundles == ({"GPU": 2.0},) for g in engines)
    assert executor_backend(2) == "mp" and executor_backend(1) == "uni"


def test_cpu_bundles_ask_for_a_cpu_share_and_the_custom_resources():
    cfg = load_config("configs/tiny.yaml", ["learner.num_ranks=2", "rollout.resources={rollout_slot: 1}"])
    groups = {g.role: g for g in placement_plan(cfg)}
    assert groups["learner"].bundles == ({"CPU": CPU_BUNDLE_CPUS},) * 2
    assert groups["rollout-0"].bundles == ({"CPU": CPU_BUNDLE_CPUS, "rollout_slot": 1.0},)


def _group_of(actor) -> str:
    """The placement group Ray placed an actor in (hex; all zeros for none), from the GCS actor table."""
    from ray._private import state
    from ray.core.generated import gcs_pb2

    info = state.state._connect_and_get_accessor().get_actor_info(actor._actor_id)
    return gcs_pb2.ActorTableData.FromString(info).placement_group_id.hex()


@pytest.mark.ray
@pytest.mark.redis
def test_a_runs_fleet_is_placed_in_its_groups_and_they_go_with_the_run(untrained_tiny, ray_session, tmp_path,
                                                                      monkeypatch):
    import ray

    import entrypoints.fleet as fleet_module
    from entrypoints.train import run_training

    seen = {}
    start = fleet_module.start_fleet

    def start_and_look(cfg, prep, redis_url, *args, **kwargs):
        fleet = start(cfg, prep, redis_url, *args, **kwargs)
        h, groups = fleet.handles, fleet.placement.groups
        seen["table"] = {role: ray.util.placement_group_table(pg) for role, pg in groups.items()}
        seen["ids"] = {role: pg.id.hex() for role, pg in groups.items()}
        seen["actors"] = {"learner": [_group_of(r) for r in h.learners.ranks], "value": [_group_of(h.scorer)],
                          **{f"rollout-{i}": [_group_of(w)] for i, w in enumerate(h.rollout_workers)}}
        return fleet

    monkeypatch.setattr(fleet_module, "start_fleet", start_and_look)
    model = str(untrained_tiny)
    cfg = load_config("configs/tiny.yaml", [
        f"model.path={model}", f"value.path={model}", "run.steps=1", "run.m=4", "run.n=2", "run.eval_every=0",
        "data.eval_size=8", "data.tiny_size=64", "selection.k=2", "value.ev_sample=4", "learner.num_ranks=2",
        "rollout.num_workers=2", "rollout.max_in_flight=2", "run.time_budget_s=null", "control.port=0",
        f"run.name={RUN}"])
    assert run_training(cfg, run_dir=str(tmp_path / "run")) == 0

    assert set(seen["table"]) == {"learner", "value", "rollout-0", "rollout-1"}
    for role, table in seen["table"].items():
        assert table["state"] == "CREATED" and table["name"] == f"{RUN}-{role}"
        assert table["strategy"] == ("PACK" if role in ("learner", "value") else "STRICT_PACK")
    assert len(seen["table"]["learner"]["bundles"]) == 2
    for role, groups in seen["actors"].items():
        assert groups == [seen["ids"][role]] * len(groups), role  # each actor inside its role's group
    for role, pg_id in seen["ids"].items():  # removed when the run ended
        assert ray.util.placement_group_table()[pg_id]["state"] == "REMOVED"


@pytest.mark.ray
def test_a_placement_no_node_can_hold_is_refused_before_any_actor_naming_the_setting(ray_session):
    import ray

    from entrypoints.fleet import PlacementError, start_fleet

    before = set(ray.util.placement_group_table())
    cfg = load_config("configs/tiny.yaml", ["learner.resources={nowhere: 1}", f"run.name={RUN}-refused"])
    with pytest.raises(PlacementError, match=r"the learner group \(.*learner.resources=\{'nowhere': 1.0\}") as no:
        start_fleet(cfg, prep=None, redis_url="redis://127.0.0.1:1/0")  # refused before prep is read
    assert "The cluster has" in str(no.value) and "CPU" in str(no.value)
    assert set(ray.util.placement_group_table()) == before  # no group made


@pytest.mark.ray
def test_a_placement_not_placed_in_time_is_refused_and_its_groups_removed(ray_session):
    import ray

    from entrypoints.fleet import PlacementError, reserve_placement

    cpus = ray.cluster_resources()["CPU"]
    before = set(ray.util.placement_group_table())
    # each V rank's bundle fits the node, the three together do not: Ray waits, the fleet gives up and cleans up
    cfg = load_config("configs/tiny.yaml", ["value.num_ranks=3", f"value.resources={{CPU: {cpus * 0.4}}}",
                                            f"run.name={RUN}-late"])
    with pytest.raises(PlacementError, match=r"the value group .* did not place it within 2s"):
        reserve_placement(cfg, timeout_s=2)
    table = ray.util.placement_group_table()
    assert all(table[pg]["state"] == "REMOVED" for pg in set(table) - before)


REJOIN = r'''
import sys, threading, time
import ray
from ray.cluster_utils import Cluster
from pcl.config import load_config
from entrypoints.fleet import PlacementError, reserve_placement

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
node = cluster.add_node(num_cpus=1, resources={"learner": 1})
ray.init(address=cluster.address)
cluster.wait_for_nodes()
cluster.remove_node(node)  # the learner node leaves: the head declares it dead
deadline = time.monotonic() + 60
while any(n["Alive"] and n["Resources"].get("learner") for n in ray.nodes()):
    assert time.monotonic() < deadline, "the removed node stayed alive"
    time.sleep(0.2)
cfg = load_config("configs/tiny.yaml", ["learner.num_ranks=1", "learner.resources={learner: 1}", "run.name=rejoin"])
try:
    reserve_placement(cfg, timeout_s=2)
    print("placed without the node")
except PlacementError as exc:
    print("refused:", exc)
placed = {}
waiting = threading.Thread(target=lambda: placed.update(groups=reserve_placement(cfg, timeout_s=120)))
waiting.start()
time.sleep(2.0)
print("waiting:", waiting.is_alive())
cluster.add_node(num_cpus=1, resources={"learner": 1})  # the node joins again
waiting.join(150)
print("placed:", sorted(placed["groups"].groups))
placed["groups"].remove()
'''
REJOIN = "try:\n" + "\n".join("    " + line for line in REJOIN.strip().splitlines()) + \
    "\nfinally:\n    ray.shutdown()\n    cluster.shutdown()\n"


@pytest.mark.ray
def test_a_driver_started_while_a_node_is_away_waits_for_it_to_join_again(tmp_path):
    """A driver resumed while the node with the learner's resource is out of the cluster (declared dead: cut off,
    restarting) waits for it: refused only once `ray.placement_timeout_s` has passed, with the reason, and placed
    when the node joins. Its own Ray cluster (a head and a node), in a process of its own."""
    import subprocess
    import sys

    from ray._common.utils import get_ray_address_file

    address_file = Path(get_ray_address_file(None))  # where Ray's test cluster names itself the machine's latest
    before = address_file.read_text() if address_file.exists() else None
    try:
        out = subprocess.run([sys.executable, "-c", REJOIN], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "RAY_ADDRESS": ""}, cwd=Path(__file__).resolve().parents[2])
    finally:  # never leave a later ray.init() to find that cluster (gone) instead of starting its own
        if before is None:
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(before)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    refused = [line for line in lines if line.startswith("refused:")]
    assert refused and "did not place it within 2s" in refused[0] and "out of the cluster" in refused[0], lines
    assert "waiting: True" in lines and "placed: ['learner', 'rollout-0', 'value']" in lines, lines
