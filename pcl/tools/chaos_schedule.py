"""The fault schedule of a chaos run (`pcl chaos`): which faults, of which kinds, at which times, and the control
plane's actions among them; a pure function of the seed, so a run can be replayed.

    window_s = fit_window(steps=150, step_s=2.0)  # the run's expected length, with a margin
    schedule = draw_schedule(seed=3, count=12, window_s=window_s)
    check_schedule(schedule, count=12)            # [] when it meets the rules below
    print(format_schedule(schedule))

Times are seconds after the run starts training (its first "actors up"). A fault aimed at a phase (a weight sync, a
checkpoint write) is armed at its time and fired at the next such phase the run itself shows; the others fire at
their time, or as soon as their target exists (a fault drawn during a restart waits for the process it kills).

The rules: `count` faults; every kind once before any kind twice (so at least min(count, 7) kinds; 12 faults cover
all 12); about a third of the faults within seconds (0.5 to 4 s) after another one. The control plane's actions
(a pause and its resume, a tau retune, a checkpoint request) are drawn from the same seed.

The window must fit the run: a fault drawn after the run's end is never injected. `fit_window` takes a share of
the run's expected unfaulted length (steps x seconds a step; `seconds_per_step` measures a run's pace from its
records): the faults' own cost only lengthens the run, so the last fault still finds it training.

`phase_of` names the phase a fault landed in from what the run showed at that moment (`Observation`).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field

# Each kind: what it does (the driving side, entrypoints/chaos/faults.py, carries it out).
KINDS: dict[str, str] = {
    "kill_rollout": "SIGKILL of a rollout worker's process",
    "kill_verifier": "SIGKILL of a reward verifier's process",
    "kill_scorer": "SIGKILL of the value scorer's process",
    "kill_learner": "SIGKILL of a learner rank's process",
    "kill_coordinator": "SIGKILL of the coordinator's process",
    "kill_driver": "SIGKILL of the driver (pcl train), then pcl train --resume",
    "redis_restart": "SIGKILL of the run's Redis (the driver starts it again)",
    "redis_full": "Redis filled to its maxmemory for a while, then freed",
    "malformed": "a malformed entry written into each work stream",
    "weight_sync": "SIGKILL of a process taking part in a weight sync, during it",
    "checkpoint_write": "SIGKILL of a process writing a checkpoint, during the write",
    "freeze": "SIGSTOP of a rollout worker's or verifier's process, held a while, then SIGCONT",
}
PHASED = {"weight_sync": "weight-sync", "checkpoint_write": "checkpoint-write"}  # kind -> the phase it waits for
# kind -> the range its hold is drawn from, in seconds: Redis kept full; a process kept stopped (from below the
# straggler timeout's 10 s floor to past configs/chaos.yaml's 25 s stuck timeout)
HOLD_S = {"redis_full": (3.0, 10.0), "freeze": (5.0, 40.0)}
MIN_FAULTS, MIN_KINDS = 12, 7  # the full run's rules (issue 35)
CLOSE_S = (0.5, 4.0)  # a clustered fault follows another by this many seconds
LEAD_S = 5.0  # no fault before the run has trained for this long
WINDOW_SHARE = 0.7  # the default window: this share of the run's expected unfaulted training time


@dataclass(frozen=True)
class Fault:
    """One scheduled fault."""

    index: int
    kind: str
    at_s: float  # seconds after training starts (a phased fault is armed then)
    target: int = 0  # which process of its kind (modulo those alive when it fires)
    hold_s: float = 0.0  # redis_full: seconds Redis stays full; freeze: seconds the process stays stopped

    @property
    def phase(self) -> str | None:
        """The phase it waits for, or None for a fault fired by the clock."""
        return PHASED.get(self.kind)


@dataclass(frozen=True)
class Action:
    """One control-plane action of the schedule: pause, resume, tau (value: the new tau) or checkpoint."""

    at_s: float
    what: str
    value: float | None = None


@dataclass(frozen=True)
class Schedule:
    seed: int
    window_s: float
    faults: tuple[Fault, ...]
    actions: tuple[Action, ...] = field(default_factory=tuple)

    @property
    def kinds(self) -> list[str]:
        return sorted({f.kind for f in self.faults})

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        raw = json.loads(text)
        return cls(raw["seed"], raw["window_s"], tuple(Fault(**f) for f in raw["faults"]),
                   tuple(Action(**a) for a in raw["actions"]))


def draw_schedule(seed: int, count: int, window_s: float, kinds: tuple[str, ...] = tuple(KINDS)) -> Schedule:
    """`count` faults over `window_s` seconds of training, and the control actions, from `seed` alone."""
    if count < 1 or window_s <= LEAD_S:
        raise ValueError(f"a schedule needs at least 1 fault and a window over {LEAD_S} s (got {count}, {window_s})")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; kinds are {sorted(KINDS)}")
    rng = random.Random(seed)
    order = rng.sample(list(kinds), min(count, len(kinds)))  # every kind once before any twice
    order += [rng.choice(list(kinds)) for _ in range(count - len(order))]
    rng.shuffle(order)
    times = sorted(rng.uniform(LEAD_S, window_s) for _ in range(count))
    close = rng.sample(range(1, count), min(count - 1, max(1, count // 3))) if count > 1 else []
    for i in sorted(close):  # in order, so a chain of close faults stays close
        times[i] = times[i - 1] + rng.uniform(*CLOSE_S)
    faults = tuple(Fault(i, kind, round(at, 2), rng.randrange(1 << 16),
                         round(rng.uniform(*HOLD_S[kind]), 1) if kind in HOLD_S else 0.0)
                   for i, (kind, at) in enumerate(zip(order, sorted(times))))
    return Schedule(seed, window_s, faults, draw_actions(rng, window_s))


def fit_window(steps: int, step_s: float, share: float = WINDOW_SHARE) -> float:
    """The window that fits a run of `steps` steps of about `step_s` seconds each (unfaulted): `share` of its
    length, and at least 2 x LEAD_S."""
    if steps < 1 or not step_s > 0:
        raise ValueError(f"a window needs steps >= 1 and seconds a step > 0 (got {steps}, {step_s})")
    return round(max(2 * LEAD_S, share * steps * step_s), 1)


def seconds_per_step(metrics_lines: list[dict]) -> float | None:
    """A run's pace from its metrics.jsonl: seconds between its first and last step records (`elapsed_seconds`,
    evaluations and checkpoints included, pauses not) over the steps between them; None with fewer than two."""
    timed = [(int(r["step"]), float(r["elapsed_seconds"])) for r in metrics_lines
             if "effective_ratio" in r and r.get("elapsed_seconds") is not None]
    if len(timed) < 2 or timed[-1][0] <= timed[0][0]:
        return None
    return (timed[-1][1] - timed[0][1]) / (timed[-1][0] - timed[0][0])


def draw_actions(rng: random.Random, window_s: float) -> tuple[Action, ...]:
    """A pause held 3 to 8 s, a tau retune and a checkpoint request, at random times within the window."""
    pause = rng.uniform(0.1, 0.8) * window_s
    actions = [Action(round(pause, 2), "pause"), Action(round(pause + rng.uniform(3.0, 8.0), 2), "resume"),
               Action(round(rng.uniform(0.1, 0.9) * window_s, 2), "tau", round(rng.uniform(0.3, 0.7), 2)),
               Action(round(rng.uniform(0.1, 0.9) * window_s, 2), "checkpoint")]
    return tuple(sorted(actions, key=lambda a: a.at_s))


def check_schedule(schedule: Schedule, count: int, min_kinds: int = MIN_KINDS) -> list[str]:
    """What in `schedule` breaks the rules for `count` faults ([] when nothing does)."""
    problems = []
    faults = schedule.faults
    if len(faults) != count:
        problems.append(f"{len(faults)} faults, not {count}")
    wanted = min(count, min_kinds)
    if len(schedule.kinds) < wanted:
        problems.append(f"{len(schedule.kinds)} kinds ({schedule.kinds}), fewer than {wanted}")
    times = [f.at_s for f in faults]
    if times != sorted(times):
        problems.append("faults are not in time order")
    if count > 1 and not any(b - a <= CLOSE_S[1] for a, b in zip(times, times[1:])):
        problems.append(f"no two faults within {CLOSE_S[1]} s of each other")
    if any(t < LEAD_S for t in times):
        problems.append(f"a fault before {LEAD_S} s of training")
    whats = sorted(a.what for a in schedule.actions)
    if whats != ["checkpoint", "pause", "resume", "tau"]:
        problems.append(f"control actions {whats}, not a pause, a resume, a tau retune and a checkpoint request")
    return problems


def format_schedule(schedule: Schedule) -> str:
    """The schedule as lines, for the report and for replaying it."""
    lines = [f"schedule of seed {schedule.seed}: {len(schedule.faults)} faults of {len(schedule.kinds)} kinds "
             f"over {schedule.window_s:g} s"]
    for f in schedule.faults:
        trigger = f"at the next {f.phase} after" if f.phase else "at"
        hold = f", held {f.hold_s:g} s" if f.hold_s else ""
        lines.append(f"  #{f.index:<2} {f.kind:<17} {trigger} {f.at_s:7.2f} s (target {f.target}{hold})")
    for a in schedule.actions:
        lines.append(f"  control {a.what}{'' if a.value is None else f' {a.value:g}'} at {a.at_s:.2f} s")
    return "\n".join(lines)


# -- phases ------------------------------------------------------------------------------------------------

# Ray names an actor's process `ray::Class` when idle and `ray::Class.method` while it runs a method.
WEIGHT_SYNC_TITLES = ("ray::LearnerRank.full_state_dict", "ray::LearnerRank.broadcast_weights",
                      "ray::RolloutWorker.load_weights", "ray::RolloutWorker.receive_weights")
CHECKPOINT_TITLES = ("ray::LearnerRank.save_checkpoint", "ray::ValueScorerActor.save_checkpoint")


@dataclass
class Observation:
    """What the run showed at one moment: the driver's state (from its output: starting, up, restarting, down,
    ending), the titles of its processes, whether a checkpoint is being written (a `.tmp-step-*` directory), the
    control plane's state, and the last step committed."""

    driver: str = "starting"
    titles: tuple[str, ...] = ()
    checkpoint_writing: bool = False
    paused: bool = False
    step: int = 0


def phase_of(obs: Observation) -> str:
    """The phase of the run in `obs`, the most specific first: driver-down, restart (the fleet starting), ending,
    checkpoint-write, weight-sync, train (a learner step), paused, or rollout (selection, generation,
    verification: the rest of a step)."""
    if obs.driver in ("down", "starting", "restarting", "ending"):
        return {"down": "driver-down", "starting": "restart", "restarting": "restart"}.get(obs.driver, obs.driver)
    if obs.checkpoint_writing or any(t.startswith(CHECKPOINT_TITLES) for t in obs.titles):
        return "checkpoint-write"
    if any(t.startswith(WEIGHT_SYNC_TITLES) for t in obs.titles):
        return "weight-sync"
    if any(t.startswith("ray::LearnerRank.train_step") for t in obs.titles):
        return "train"
    return "paused" if obs.paused else "rollout"
