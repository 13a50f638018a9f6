"""The running fleet against the declared stream topology (services/streams/topology.py), on real parts: an embedded
Redis server, local Ray, the rollout worker (HF engine) and math-verify verifier actors, the coordinator's
RolloutClient, an untrained tiny policy. After a step, Redis holds exactly the declared streams of the run, each
with only its declared group, which has taken entries, and whose consumers are all members of the declared role."""

from __future__ import annotations

import os

import pytest

from pcl.config import load_config

pytestmark = [pytest.mark.ray, pytest.mark.redis]


def test_the_fleet_uses_exactly_the_declared_streams_groups_and_consumer_roles(untrained_tiny, tmp_path):
    import ray

    from entrypoints.probe_batch import start_generation_fleet
    from actors.runtime import start_ray
    from entrypoints.train import prepare
    from services.redis_server import start_embedded
    from services.streams.rollout_client import RolloutClient
    from services.incarnations import live_incarnations
    from services.streams.topology import STREAMS, stream_key

    run = "topology"
    cfg = load_config("configs/tiny.yaml", [
        f"model.path={untrained_tiny}", f"value.path={untrained_tiny}", "selection.type=uniform", f"run.name={run}",
        "run.m=4", "run.n=2", "data.tiny_size=256", "data.eval_source=null", "control.enabled=false"])
    prep = prepare(cfg, str(tmp_path / "run"), None)
    with start_embedded(tmp_path / "redis", appendonly=False) as redis_server:
        own_ray, actors = start_ray(), []
        try:
            actors = start_generation_fleet(cfg, prep, redis_server.url)
            samples = RolloutClient(cfg, redis_server.url).generate(1, 0, prep.train_prompts[:4], 2)
            assert len(samples) == 8
            client = redis_server.client()
            streams = {key.decode() for key in client.scan_iter(match=f"pcl:{run}:*", _type="stream")}
            assert streams == {stream_key(run, s.name) for s in STREAMS}  # nothing dead-lettered, nothing else
            for s in STREAMS:
                key = stream_key(run, s.name)
                [group] = client.xinfo_groups(key)
                assert group["name"].decode() == s.group and group["last-delivered-id"] != b"0-0", (s, group)
                consumers = {c["name"].decode() for c in client.xinfo_consumers(key, s.group)}
                assert consumers and {name.split("-")[0] for name in consumers} == {s.consumer}, (s, consumers)
            # Each serving actor beats its heartbeat: its role and instance, its process and Ray node.
            live = {e["instance"]: e for e in live_incarnations(client, run)}
            assert set(live) == {"rollout-0", "verifier-0"}, live
            node = ray.get_runtime_context().get_node_id()
            assert all(e["role"] == name.split("-")[0] and e["node"] == node and e["pid"] != os.getpid()
                       for name, e in live.items()), live
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)
            if own_ray:
                ray.shutdown()
