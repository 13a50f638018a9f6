"""The fault schedule of a cluster chaos run (`pcl chaos-cluster`, `make test-chaos-cluster`): node-level faults on a
Ray cluster of containers (a node killed, frozen, cut off from Redis or from the head or from both, a lossy or slow
link, Redis restarted, the job's driver killed); a pure function of the seed, so a run can be replayed.

    schedule = draw_cluster_schedule(seed=1, per_kind=2, kinds=tuple(CLUSTER_KINDS))
    check_cluster_schedule(schedule, per_kind=2)    # [] when it meets the rules below
    steps = schedule_steps(schedule)                # run.steps that leave room for every fault
    print(format_cluster_schedule(schedule))

Faults are paced by the run's own progress, not by the clock, so that a slow host delays the schedule instead of
ending the run before it: a fault fires `after_steps` steps committed after the previous fault healed (the run has
recovered from it), or, for an overlapping fault, `overlap_s` seconds after the previous one was injected (on
another target: one fault at a time on each node). A fault holds `hold_s` seconds, then heals (the node started
again, resumed, reconnected; Redis started again; the job resubmitted with --resume).

The rules: `per_kind` faults of each kind; the holds of the kinds with two regimes drawn from both (a freeze
shorter and longer than Ray's node death; a cut shorter than the visibility timeout and longer than the node death);
about a third of the faults overlapping the one before.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass

NODES = ("rollout", "rollout2", "learner")  # the chaos cluster's worker nodes (deploy/chaos-cluster.yml)
# kind -> (what it does, the targets it may hit, its holds in seconds: one range, or (short, long) ranges)
CLUSTER_KINDS: dict[str, tuple[str, tuple[str, ...], tuple[tuple[float, float], ...]]] = {
    "node_kill": ("docker kill of a node's container, docker start after the hold", NODES, ((3.0, 15.0),)),
    "node_pause": ("docker pause of a node, unpaused after the hold: shorter, then longer than Ray's node death",
                   NODES, ((4.0, 12.0), (32.0, 38.0))),
    "cut_redis": ("the node's packets to and from Redis dropped (iptables in its network namespace)", NODES,
                  ((3.0, 6.0), (32.0, 38.0))),
    "cut_head": ("the node's packets to and from the Ray head dropped", NODES, ((3.0, 6.0), (32.0, 38.0))),
    "cut_both": ("every packet of the node dropped but its loopback's: cut from Redis, the head and its peers",
                 NODES, ((3.0, 6.0), (32.0, 38.0))),
    "packet_loss": ("a share (20-40%) of the node's packets dropped at random (iptables -m statistic)", NODES,
                    ((15.0, 25.0),)),
    "latency": ("the node's Redis traffic delayed 100-400 ms each way by the delay proxy", NODES, ((15.0, 25.0),)),
    "redis_restart": ("docker kill of the Redis container, docker start after the hold", ("redis",), ((1.0, 5.0),)),
    "driver_kill": ("SIGKILL of the job's driver (pcl train on the head), the job resubmitted with --resume",
                    ("driver",), ((0.0, 0.0),)),
}
LEAD_STEPS = 8  # steps trained before the first fault (the pre-fault throughput)
GAP_STEPS = (10, 14)  # steps committed after a fault heals before the next one (its throughput judged there)
OVERLAP_S = (0.5, 4.0)  # an overlapping fault follows the previous injection by this many seconds
TAIL_STEPS = 15  # steps left after the last fault's gap: a run.steps margin for a slow or stalled schedule
STEP_S = 1.0  # seconds a step takes while a fault holds (under load, 3 s: a run only longer; unloaded, under 1 s)


@dataclass(frozen=True)
class ClusterFault:
    index: int
    kind: str
    target: str  # a node (NODES), "redis" or "driver"
    hold_s: float
    after_steps: int = 0  # steps committed after the previous fault healed (0 with overlap_s)
    overlap_s: float | None = None  # seconds after the previous fault's injection (an overlapping fault)
    level: float = 0.0  # packet_loss: the share dropped; latency: the delay in ms

    @property
    def regime(self) -> str:
        """'short' or 'long' for the kinds with two regimes of hold, else ''."""
        holds = CLUSTER_KINDS[self.kind][2]
        if len(holds) < 2:
            return ""
        return "long" if self.hold_s >= holds[1][0] else "short"


@dataclass(frozen=True)
class ClusterSchedule:
    seed: int
    faults: tuple[ClusterFault, ...]

    @property
    def kinds(self) -> list[str]:
        return sorted({f.kind for f in self.faults})

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "ClusterSchedule":
        raw = json.loads(text)
        return cls(raw["seed"], tuple(ClusterFault(**f) for f in raw["faults"]))


def draw_cluster_schedule(seed: int, per_kind: int = 2, kinds: tuple[str, ...] = tuple(CLUSTER_KINDS)) -> ClusterSchedule:
    """`per_kind` faults of each of `kinds`, in a seeded order, from `seed` alone."""
    unknown = sorted(set(kinds) - set(CLUSTER_KINDS))
    if unknown or not kinds or per_kind < 1:
        raise ValueError(f"kinds {sorted(kinds)} (unknown: {unknown}), per_kind {per_kind}: kinds are "
                         f"{sorted(CLUSTER_KINDS)}, per_kind >= 1")
    rng = random.Random(seed)
    order = [kind for kind in kinds for _ in range(per_kind)]
    rng.shuffle(order)
    counts: dict[str, int] = {}
    faults: list[ClusterFault] = []
    for i, kind in enumerate(order):
        _, targets, holds = CLUSTER_KINDS[kind]
        n = counts[kind] = counts.get(kind, 0) + 1
        low, high = holds[(n - 1) % len(holds)]  # the regimes in turn: short first, then long
        overlap = None
        choices = list(targets)
        if faults and rng.random() < 1 / 3:
            previous = faults[-1]
            if len([t for t in choices if t != previous.target]) > 0:
                overlap = round(rng.uniform(*OVERLAP_S), 2)
                choices = [t for t in choices if t != previous.target]
        level = {"packet_loss": round(rng.uniform(0.2, 0.4), 2),
                 "latency": float(rng.randrange(100, 401, 50))}.get(kind, 0.0)
        faults.append(ClusterFault(i, kind, rng.choice(choices), round(rng.uniform(low, high), 1),
                                   0 if overlap is not None else (LEAD_STEPS if i == 0 else rng.randint(*GAP_STEPS)),
                                   overlap, level))
    return ClusterSchedule(seed, tuple(faults))


def schedule_steps(schedule: ClusterSchedule, step_s: float = STEP_S) -> int:
    """run.steps for the schedule: the steps its gaps ask for, those the run may train while the faults hold (at
    `step_s` a step: a fault that does not stop the run, a lossy link, lets it train on), a margin of restarts'
    redone steps and a tail. Too few, and the last faults find the run ended; too many only lengthen the tail."""
    held = sum(f.hold_s for f in schedule.faults if f.overlap_s is None)
    return sum(f.after_steps for f in schedule.faults) + round(held / step_s) + TAIL_STEPS + 2 * len(schedule.faults)


def check_cluster_schedule(schedule: ClusterSchedule, per_kind: int) -> list[str]:
    """What in `schedule` breaks the rules (module docstring); [] when nothing does."""
    problems = []
    counts: dict[str, list[ClusterFault]] = {}
    for f in schedule.faults:
        counts.setdefault(f.kind, []).append(f)
    for kind, faults in sorted(counts.items()):
        if len(faults) != per_kind:
            problems.append(f"{kind}: {len(faults)} faults, not {per_kind}")
        if len(CLUSTER_KINDS[kind][2]) == 2 and per_kind >= 2 and {f.regime for f in faults} != {"short", "long"}:
            problems.append(f"{kind}: holds {[f.hold_s for f in faults]} are not both short and long")
        if any(f.target not in CLUSTER_KINDS[kind][1] for f in faults):
            problems.append(f"{kind}: a target outside {CLUSTER_KINDS[kind][1]}")
    for a, b in zip(schedule.faults, schedule.faults[1:]):
        if b.overlap_s is not None and b.target == a.target:
            problems.append(f"#{b.index} overlaps #{a.index} on the same target {a.target}")
        if (b.overlap_s is None) == (b.after_steps == 0):
            problems.append(f"#{b.index}: neither (or both) after_steps and overlap_s")
    if len(schedule.faults) > 2 and not any(f.overlap_s is not None for f in schedule.faults):
        problems.append("no fault overlaps another")
    return problems


def format_cluster_schedule(schedule: ClusterSchedule) -> str:
    """The schedule as lines, for the report and for replaying it."""
    lines = [f"schedule of seed {schedule.seed}: {len(schedule.faults)} faults of {len(schedule.kinds)} kinds, "
             f"run.steps {schedule_steps(schedule)}"]
    for f in schedule.faults:
        when = (f"{f.overlap_s:g} s after #{f.index - 1}'s injection" if f.overlap_s is not None
                else f"{f.after_steps} steps after #{f.index - 1} healed" if f.index else f"at step {f.after_steps}")
        level = {"packet_loss": f", {f.level:.0%} lost", "latency": f", {f.level:g} ms"}.get(f.kind, "")
        lines.append(f"  #{f.index:<2} {f.kind:<13} {f.target:<8} held {f.hold_s:5.1f} s{level} {f.regime:<5}  "
                     f"{when}")
    return "\n".join(lines)
