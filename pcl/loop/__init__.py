"""The training loop of a run, free of Ray and Redis: the algorithm behind small ports.

    loop = StepLoop(cfg, strategy, prompts, scorer, rollouts, learner, run_dir)   # the algorithm, one step
    run = TrainingRun(cfg, run_dir, loop, Evaluation(cfg, rollouts, run_dir, held_out, suite), control)
    run.restore(checkpoint)        # optional
    summary = run.run()

    ports.py        the interfaces it talks to: Prompts, Scorer, Rollouts, Learner, Control, Clock
    step.py         one step, as the paper's algorithm reads (candidates, V, selection, generation, updates)
    run.py          the schedule: step-0 evaluation, steps, pauses, the time budget, evaluations, checkpoints
    state.py        what survives a restart (counters, RNG, the prefetched pool) and the run's two clocks
    curriculum*.py  whether the curriculum pays: V's calibration and lag, the pool, the gain over uniform selection
    checkpoints.py  when checkpoints are written, what is in them, continuing from one; the best checkpoint
    evaluation.py   held-out accuracy and the benchmark suite during training
    reference.py    the initial policy's pass rates (the prefilter baseline)
    local/          the ports in one process, over the classes the actors wrap (`pcl train --local`)

`actors/coordinator.py` runs it on the Ray fleet (`actors/ports.py` implements the ports there), `pcl.loop.local`
in one process; `tests/pcl/loop/` runs it on in-memory fakes.
"""

from pcl.loop.evaluation import Evaluation
from pcl.loop.run import TrainingRun
from pcl.loop.step import StepLoop

__all__ = ["Evaluation", "StepLoop", "TrainingRun"]
