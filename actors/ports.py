"""The step loop's ports (`pcl.loop.ports`) on the Ray fleet and the Redis streams.

    prompts  = SamplerPrompts(fleet.sampler, timeout_s)               # fleet: actors.handles.FleetHandles
    scorer   = ActorScorer(fleet.scorer, timeout_s)                   # the ValueScorerActor (V)
    learner  = FleetLearner(cfg, fleet.learners, fleet.rollout_workers, fleet.policy_path)
    repair   = FleetRepair(learner, fleet.named())                     # actors.stragglers: stragglers, stuck workers
    rollouts = StreamRollouts(RolloutClient(cfg, redis_url, learner.live_workers, on_watch=repair), learner, timeout_s,
                              repair)

`FleetLearner` also repairs the fleet: while a generation call waits for its samples, `StreamRollouts` has it
give the current weights to any rollout worker that Ray restarted (it serves nothing until then). A rollout worker
without progress (`services.streams.stragglers`: a stopped process, a hung engine) is left out of the chunks and of
the weight syncs, and takes the current weights when it makes progress again (`watched`).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import ray

from actors.handles import FleetHandles
from actors.runtime import gather, gather_answered
from actors.weight_sync import laggard_wait, weight_sender
import pcl.checkpoint_store as ckpt
from pcl.config import Config
from pcl.engines.request import RolloutRequest

log = logging.getLogger(__name__)


class RefPending:
    """A remote call's result, fetched with the run's deadline (learner.timeout_s): it never waits forever."""

    def __init__(self, ref, timeout_s: float):
        self.ref, self.timeout_s = ref, timeout_s

    def result(self) -> Any:
        return ray.get(self.ref, timeout=self.timeout_s)


class SamplerPrompts:
    def __init__(self, sampler, timeout_s: float):
        self.sampler, self.timeout_s = sampler, timeout_s

    def _get(self, ref) -> Any:
        return ray.get(ref, timeout=self.timeout_s)

    def sample(self, count: int) -> list:
        return self._get(self.sampler.sample.remote(count))

    def records(self) -> list:
        return self._get(self.sampler.records.remote())

    def state_dict(self) -> dict[str, Any]:
        return self._get(self.sampler.state_dict.remote())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._get(self.sampler.load_state_dict.remote(state))


class ActorScorer:
    def __init__(self, scorer, timeout_s: float):
        self.scorer, self.timeout_s = scorer, timeout_s

    def score(self, prompt_token_ids: Sequence[Sequence[int]]) -> RefPending:
        return RefPending(self.scorer.score.remote(list(prompt_token_ids)), self.timeout_s)

    def train(self, prompt_token_ids: Sequence[Sequence[int]], pass_rates: Sequence[float]) -> RefPending:
        return RefPending(self.scorer.train.remote(list(prompt_token_ids), list(pass_rates)), self.timeout_s)

    def save(self, directory: str) -> None:
        RefPending(self.scorer.save_checkpoint.remote(directory), self.timeout_s).result()

    def load(self, directory: str) -> None:
        RefPending(self.scorer.load_checkpoint.remote(directory), self.timeout_s).result()


class FleetBehind(RuntimeError):
    """Asynchronous steps: every rollout worker that could serve the generation in flight was lost, and its policy
    version exists nowhere else (the learner has trained past it). A restart from the last checkpoint cures it."""


class FleetLearner:
    """The learner group, and the weights every rollout worker serves (`actors.weight_sync`: by rpc through the
    object store, or the collective broadcast of `rollout.weight_sync: collective`)."""

    def __init__(self, cfg: Config, learners, workers: list, policy_path: str | None):
        self.cfg, self.learners, self.workers, self.policy_path = cfg, learners, workers, policy_path
        self.timeout_s = cfg.learner.timeout_s
        self.sender = weight_sender(cfg, learners, workers)
        self.policy_version = 0
        self.worker_reloads = 0  # weights given to rollout workers Ray restarted
        self.unavailable: set[int] = set()  # workers that did not answer the last fleet check (restarting)
        self.straggling: set[int] = set()  # workers without progress for their straggler timeout (heartbeats)
        self.behind: set[int] = set()  # workers a weight sync left out or behind: they lack the current version
        self.asked: dict[int, Any] = {}  # a left-behind worker's policy version, asked and not yet answered
        self.ahead = False  # the learner has trained past the version the fleet serves (not yet synced)

    def train(self, sequences: Sequence[dict], global_count: int) -> dict[str, float]:
        self.ahead = True
        return self.learners.train(sequences, global_count=global_count)

    def sync_weights(self, version: int) -> None:
        """Push the learner's new weights to every rollout worker that makes progress; from here on they serve
        `version`. A straggler is left out, and one that does not load within the laggard wait is left behind
        (`actors.weight_sync`): it gets no chunk until it takes the weights (`watched`). A worker that dies
        meanwhile is restarted by Ray and the load retried on it."""
        everyone = set(range(len(self.workers)))
        self.behind = everyone - self.sender.sync(version, sorted(everyone - self.straggling))
        self.policy_version = version
        self.ahead = False

    def watched(self, watch) -> None:
        """After a look at the fleet's progress (`services.streams.stragglers.StragglerWatch`): stragglers are left
        out of the next chunks and syncs, and a worker left behind that makes progress again takes the current
        weights, unless its queued load gave it them (not while the learner trains ahead of the fleet: the next
        sync gives it them). Its version is asked without waiting: the answer is read at a later look."""
        names = watch.straggling("rollout")
        self.straggling = {i for i in range(len(self.workers)) if f"rollout-{i}" in names}
        if self.ahead:
            return
        for index in sorted(self.behind - self.straggling):
            worker = self.workers[index]
            ref = self.asked.setdefault(index, worker.policy_version.remote())
            if not ray.wait([ref], timeout=0)[0]:
                continue
            del self.asked[index]
            try:
                if ray.get(ref) != self.policy_version:
                    self.sender.reload(worker, self.policy_version)
                    self.worker_reloads += 1
            except (ray.exceptions.RayError, TimeoutError) as exc:  # GetTimeoutError is both
                log.warning("rollout worker %d, left behind by a weight sync, did not take version %d: %r", index,
                            self.policy_version, exc)
                continue
            self.behind.discard(index)

    def check_fleet(self) -> None:
        """Give the current weights to rollout workers that lack them: one that Ray restarted after its process
        died holds the initial weights and serves nothing until then (at version 0, when those are current, it
        is only told to serve). While the learner trains ahead of the fleet (asynchronous steps), the learner no
        longer holds the fleet's version: such a worker waits for the next sync."""
        refs = [None if i in self.straggling else w.policy_version.remote() for i, w in enumerate(self.workers)]
        asked = [ref for ref in refs if ref is not None]
        ready, _ = ray.wait(asked, num_returns=len(asked), timeout=2.0) if asked else ([], [])
        self.unavailable, serving = set(), 0
        for index, (worker, ref) in enumerate(zip(self.workers, refs)):
            if ref is None or ref not in ready:
                self.unavailable.add(index)
                continue  # restarting (its model is loading), or making no progress: seen at the next check
            try:
                version = ray.get(ref)
            except ray.exceptions.RayError:
                self.unavailable.add(index)
                continue
            serving += version == self.policy_version or self.policy_version == 0
            if version == self.policy_version:
                self.behind.discard(index)  # it took the weights meanwhile (a queued load of a left-behind worker)
            elif self.policy_version == 0:
                ray.get(worker.serve.remote(), timeout=self.timeout_s)  # version 0: its initial weights are current
            elif self.ahead:
                # Asynchronous steps: the learner already trains past the version the fleet serves, so its weights
                # are not that version's any more; the worker serves from the next sync, the others meanwhile.
                log.warning("rollout worker holds policy version %s, not %s (restarted?), while the learner trains "
                            "ahead: it serves from the next weight sync", version, self.policy_version)
            else:
                log.warning("rollout worker holds policy version %s, not %s (restarted?): reloading its weights",
                            version, self.policy_version)
                self.sender.reload(worker, self.policy_version)
                self.worker_reloads += 1
                self.behind.discard(index)
        if self.ahead and not serving and not self.unavailable:  # every worker answered, none holds the version
            raise FleetBehind(f"no rollout worker serves policy version {self.policy_version} any more (restarted) "
                              "while the learner trains ahead of it (run.max_staleness), and the learner no longer "
                              "holds that version: the run restarts from its last checkpoint")

    def live_workers(self) -> int:
        """Rollout workers that answered the last fleet check (all of them before the first), make progress and
        hold the current weights: a step's requests are cut into this many chunks, so the share of a restarting,
        frozen or stale worker goes to the others."""
        return max(1, len(self.workers) - len(self.unavailable | self.straggling | self.behind))

    def save(self, directory: str) -> None:
        """The learner group's files, and the tokenizer beside the policy in Hugging Face format."""
        self.learners.save_checkpoint(directory)
        if self.policy_path:
            from pcl.data.inputs import load_tokenizer  # noqa: PLC0415 - transformers: heavy, only for checkpoints

            load_tokenizer(self.cfg, self.policy_path).save_pretrained(Path(directory) / "policy")

    def load(self, directory: str) -> None:
        self.learners.load_checkpoint(directory)


class StreamRollouts:
    """Generation through the request, result and reward streams (`services.streams.rollout_client`), checking the
    fleet's weights while it waits."""

    def __init__(self, client, fleet: FleetLearner, timeout_s: float, repair=None):
        """repair: the `actors.stragglers.FleetRepair` the client's watch calls (its restarts are counted here)."""
        self.client, self.fleet, self.timeout_s, self.repair = client, fleet, timeout_s, repair

    def generate_rollouts(self, step: int, policy_version: int, requests: Sequence[RolloutRequest], tag: str = "",
                          on_progress=None) -> list:
        return self.client.generate_rollouts(step, policy_version, requests, tag=tag, on_wait=self.fleet.check_fleet,
                                             on_progress=on_progress)

    @property
    def restarts(self) -> Counter:
        return self.repair.restarts if self.repair is not None else Counter()

    def counters(self) -> dict[str, int]:
        return {"worker_reloads": self.fleet.worker_reloads, **self.client.counters(),
                "stuck_restarts_by_worker": dict(sorted(self.restarts.items()))}

    def state_dict(self) -> dict[str, Any]:
        """The counters, and each rollout engine's sampling state (None for a straggler, or a worker that does not
        answer within the laggard wait: a frozen worker does not hold the checkpoint)."""
        workers = self.fleet.workers
        asked = [i for i in range(len(workers)) if i not in self.fleet.straggling]
        refs = [workers[i].rng_state.remote() for i in asked]
        answered = gather_answered(refs, self.timeout_s, "rollout engine state", laggard_wait)
        engines = [None] * len(workers)
        for i, ref, ok in zip(asked, refs, answered):
            engines[i] = ray.get(ref) if ok else None
        c = self.client
        return {"worker_reloads": self.fleet.worker_reloads, "engines": engines,
                "rollout_counters": {"dropped": dict(c.dropped), "totals": dict(c.totals),
                                     "stale_by_producer": dict(c.stale_by_producer),
                                     "late_by_verifier": dict(c.late_by_verifier),
                                     "handed_over": dict(c.watch.handed_over), "stuck_restarts": dict(self.restarts)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fleet.worker_reloads = int(state.get("worker_reloads", 0))
        counters, c = state["rollout_counters"], self.client
        for kept, name in ((c.dropped, "dropped"), (c.stale_by_producer, "stale_by_producer"), (c.totals, "totals"),
                           (c.late_by_verifier, "late_by_verifier"), (c.watch.handed_over, "handed_over"),
                           (self.restarts, "stuck_restarts")):
            kept.update(counters.get(name, {}))
        workers = self.fleet.workers
        if len(state["engines"]) == len(workers):
            pairs = [(w, e) for w, e in zip(workers, state["engines"]) if e is not None]
            gather([w.load_rng_state.remote(e) for w, e in pairs], self.timeout_s, "rollout engine state")


def state_bytes_estimate(fleet: FleetHandles) -> int:
    """The first checkpoint's size, before there is one to measure: the policy's and V's model files."""
    models = (fleet.policy_path, fleet.value_path if fleet.scorer is not None else None)
    return ckpt.state_bytes_estimate([p for p in models if p])
