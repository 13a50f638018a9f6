"""The invariants a chaos run (`pcl chaos`) must keep, checked at its end from the run's own records and what its
Redis holds, never from the fault injector's log. Pure: each check takes what was read and returns a `Check`.

    checks = [check_steps(metrics_lines, steps), check_batches(metrics_lines, selections, m, n),
              check_streams(streams, dead_letters), check_processes(leftovers),
              check_weights(max_abs_diff), check_control(requests)]

- steps: every step 1..steps has exactly one line in metrics.jsonl and selections.jsonl (none twice, none
  skipped, none after the end), in order, and the policy version after step s is s (one update per step: the step
  counter never went back, and no step trained on another step's policy);
- batches: each step trained on its m x n samples, each (prompt, sample index) once: the step record's
  `batch_samples` and `batch_unique_samples`, and selections.jsonl's m prompt ids with the sample indices each
  one trained on (0 .. n-1, each once);
- streams: no work stream's group holds a pending entry, and every dead letter is one of the malformed entries the
  chaos run wrote (they carry MALFORMED_MARK);
- processes: no process of the run is alive after it ended;
- weights: the final weights equal the reference run's (deterministic rollouts), or the final held-out accuracy
  is within noise of the reference's;
- control: the control plane answered every request with 2xx or 4xx, except while the driver was down (refusals
  then are allowed and counted); /readyz answering 503 while Redis is unreachable is its answer (counted).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

MALFORMED_MARK = b"pcl-chaos-malformed"  # in the payload of every malformed entry a chaos run writes
WEIGHT_TOLERANCE = 1e-6  # max |w - w_ref| for "equal" final weights (float32 round-off of the same updates)
ACCURACY_SIGMAS = 3.0  # "within noise": |a - a_ref| <= 3 standard errors of the difference


@dataclass
class Check:
    name: str
    ok: bool | None  # None: could not be checked (skipped), with the reason in detail
    detail: str

    @property
    def status(self) -> str:
        return {True: "PASS", False: "FAIL", None: "SKIP"}[self.ok]


def _listed(items, limit: int = 8) -> str:
    items = list(items)
    return ", ".join(map(str, items[:limit])) + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def training_lines(lines: list[dict]) -> list[dict]:
    """The step records among metrics.jsonl's lines (a held-out evaluation before the first step is not one)."""
    return [r for r in lines if "effective_ratio" in r]


def check_steps(metrics_lines: list[dict], selections: list[dict], steps: int) -> Check:
    """Steps 1..steps, each once and in order, in both files; policy version s after step s."""
    problems = []
    for name, lines in (("metrics.jsonl", training_lines(metrics_lines)), ("selections.jsonl", selections)):
        got = [int(r["step"]) for r in lines]
        twice = sorted(s for s, c in Counter(got).items() if c > 1)
        if twice:
            problems.append(f"{name}: steps written twice: {_listed(twice)}")
        missing = sorted(set(range(1, steps + 1)) - set(got))
        if missing:
            problems.append(f"{name}: steps missing: {_listed(missing)}")
        extra = sorted(set(got) - set(range(1, steps + 1)))
        if extra:
            problems.append(f"{name}: steps beyond 1..{steps}: {_listed(extra)}")
        back = [(a, b) for a, b in zip(got, got[1:]) if b <= a]
        if back:
            problems.append(f"{name}: the step counter went back: {_listed(f'{a} -> {b}' for a, b in back)}")
    evals = Counter(int(r["step"]) for r in metrics_lines if "effective_ratio" not in r)
    if any(c > 1 for c in evals.values()):
        twice = [s for s, c in evals.items() if c > 1]
        problems.append(f"metrics.jsonl: evaluation lines written twice for steps {_listed(twice)}")
    versions = [(r["step"], r.get("policy_version")) for r in training_lines(metrics_lines)
                if r.get("policy_version") != r["step"]]
    if versions:
        problems.append(f"policy version is not the step after it: {_listed(f'step {s}: {v}' for s, v in versions)}")
    ok = not problems
    return Check("steps", ok, f"steps 1..{steps} each once, in order, policy version = step" if ok
                 else "; ".join(problems))


def check_batches(metrics_lines: list[dict], selections: list[dict], m: int, n: int) -> Check:
    """Each step's batch: m*n samples, each (prompt, sample index) once."""
    problems = []
    for r in training_lines(metrics_lines):
        if not r.get("batch_samples") == r.get("batch_unique_samples") == m * n:
            problems.append(f"step {r['step']}: batch_samples {r.get('batch_samples')}, unique "
                            f"{r.get('batch_unique_samples')}, not {m * n}")
    unrecorded = 0
    for s in selections:
        ids, indices = s.get("ids", []), s.get("samples")
        if len(ids) != m or len(set(ids)) != m:
            problems.append(f"step {s['step']}: {len(ids)} prompt ids ({len(set(ids))} distinct), not {m}")
        if indices is None:
            unrecorded += 1
            continue
        bad = [pid for pid, got in zip(ids, indices) if sorted(got) != list(range(n))]
        if len(indices) != len(ids) or bad:
            problems.append(f"step {s['step']}: prompts without sample indices 0..{n - 1} each once: {_listed(bad)}")
    if unrecorded:
        problems.append(f"{unrecorded} selections.jsonl lines record no sample indices")
    ok = not problems
    return Check("batches", ok, f"every step trained on its {m} x {n} samples, each (prompt, sample) once" if ok
                 else "; ".join(problems[:10]) + (f" (+{len(problems) - 10} more)" if len(problems) > 10 else ""))


def check_streams(streams: dict[str, dict], dead_letters: list[dict]) -> Check:
    """`streams`: name -> {"pending": entries its group holds un-acked, "length": entries}; `dead_letters`: each
    {"stream", "payload" (bytes), "error"}. No pending entry; every dead letter an injected malformed entry."""
    problems = [f"{name}: {info['pending']} pending entries" for name, info in streams.items() if info["pending"]]
    foreign = [d for d in dead_letters if MALFORMED_MARK not in bytes(d["payload"])]
    problems += [f"{d['stream']}: a dead letter not injected ({str(d['error'])[:160]})" for d in foreign]
    injected = len(dead_letters) - len(foreign)
    ok = not problems
    return Check("streams", ok, (f"no pending entries; {injected} dead letters, all injected malformed entries" if ok
                                 else "; ".join(problems[:10])))


def check_processes(leftovers: list[str]) -> Check:
    """`leftovers`: the run's processes still alive after it ended ("pid title")."""
    ok = not leftovers
    return Check("processes", ok, "no process of the run left alive" if ok
                 else f"{len(leftovers)} processes of the run left alive: {_listed(leftovers)}")


def check_weights(max_abs_diff: float | None, why_not: str = "") -> Check:
    """Final weights equal the reference run's (deterministic mode); None with `why_not` when not compared."""
    if max_abs_diff is None:
        return Check("weights", None, why_not or "no reference run (pass --reference)")
    ok = max_abs_diff <= WEIGHT_TOLERANCE
    return Check("weights", ok, f"final weights {'equal' if ok else 'differ from'} the reference run's: "
                                f"max |w - w_ref| = {max_abs_diff:.3g} (tolerance {WEIGHT_TOLERANCE:g})")


def check_accuracy(final: tuple[float, float | None] | None, reference: tuple[float, float | None] | None,
                   why_not: str = "") -> Check:
    """Final held-out accuracy (with its standard error) within ACCURACY_SIGMAS of the reference's."""
    if final is None or reference is None:
        return Check("accuracy", None, why_not or "no final held-out accuracy to compare (run.eval_every)")
    (a, se_a), (b, se_b) = final, reference
    bound = ACCURACY_SIGMAS * math.hypot(se_a or 0.0, se_b or 0.0)
    ok = abs(a - b) <= bound
    return Check("accuracy", ok, f"final held-out accuracy {a:.3f} vs the reference's {b:.3f}: |diff| "
                                 f"{abs(a - b):.3f} {'<=' if ok else '>'} {bound:.3f} ({ACCURACY_SIGMAS:g} s.e.)")


READINESS_PROBE = "GET /readyz"  # its 503 says "Redis unreachable": the probe's answer, not a refusal


def check_control(requests: list[dict]) -> Check:
    """`requests`: each {"what", "status" (int, or None when nothing answered), "error", "driver_up" (bool)}. Every
    request answered 2xx or 4xx, except refusals while the driver was down (counted). A 503 of the readiness probe
    (/readyz) is an answer: its contract is 503 while Redis is unreachable (a Redis restart), when the reads
    answer from their last good reading and mutations wait for Redis (counted apart)."""
    answered = Counter(r["status"] // 100 for r in requests if r["status"] is not None)
    refused = [r for r in requests if r["status"] is None and not r["driver_up"]]
    unready = [r for r in requests if r["what"] == READINESS_PROBE and r["status"] == 503]
    bad = [r for r in requests if (r["status"] is None and r["driver_up"])
           or (r["status"] is not None and r["status"] // 100 not in (2, 4) and r not in unready)]
    summary = (f"{len(requests)} requests: {answered[2]} 2xx, {answered[4]} 4xx, {answered[5]} 5xx "
               f"({len(unready)} of them /readyz: Redis unreachable); {len(refused)} refused while the driver was down")
    if not requests:
        return Check("control", None, "no control-plane request was made")
    ok = not bad
    return Check("control", ok, summary if ok else summary + "; not answered 2xx/4xx: " + _listed(
        f"{r['what']} -> {r['status'] or r['error']} ({r.get('phase', '?')})" for r in bad))
