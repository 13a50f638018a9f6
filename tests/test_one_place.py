"""Each rule of the service lives in one place, read from the source: a second copy of a rule is a failure here.

    the truncation rule        pcl/reward/verdict.py (is_truncated, TRUNCATED_REWARD, response_reward)
    the resume rule            pcl/loop/resume.py (RESUME_FIXED, check_resumable, resolve_selection)
    the prompt-set fingerprint pcl/data/fingerprint.py
    the training-data check    pcl/data/fingerprint.py (check_same_data), called by the sampler actor only
    the run's inputs           pcl/data/inputs.py (model paths, tokenizer, prompt sets)
    environment fallbacks      pcl/config.py (ENV_FALLBACKS)
    sampling parameters        pcl/engines/request.py (SamplingParams: the loop's, the wire's and the engines' one type)
    the verified sample        pcl/samples.py (Sample: what the rollouts return, the strategies and the loop hold)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = ("pcl", "services", "actors", "entrypoints", "bench")


DRIVERS = ("entrypoints", "bench")  # they take a run's inputs from pcl.data.inputs
INPUT_CALLERS = ("entrypoints/train.py", "entrypoints/experiment.py", "entrypoints/evaluate.py", "bench/selection.py",
                 "bench/step.py")  # the callers that once each resolved the model and loaded tokenizer and prompts


def sources(tops=CODE) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for top in tops
            for p in ([ROOT / top] if str(top).endswith(".py") else (ROOT / top).rglob("*.py"))}


def holders(pattern: str, tops=CODE) -> list[str]:
    rx = re.compile(pattern)
    return sorted(path for path, text in sources(tops).items() if rx.search(text))


@pytest.mark.parametrize("rule, pattern, tops, home", [
    ("a truncated response scores 0", r"""finish_reason\s*[!=]=\s*["']length["']""", CODE, ["pcl/reward/verdict.py"]),
    ("the resume rule", r"RESUME_FIXED\s*=|def check_resumable\b", CODE, ["pcl/loop/resume.py"]),
    ("the prompt-set fingerprint", r"def \w*fingerprint\w*\(", CODE, ["pcl/data/fingerprint.py"]),
    ("the training-data check", r"fingerprint_differences\(", CODE, ["pcl/data/fingerprint.py"]),
    ("loading a run's tokenizer", r"AutoTokenizer\.from_pretrained\(", INPUT_CALLERS, []),
    ("loading a run's prompt sets", r"\bload_prompts\(", DRIVERS, []),
    ("resolving a run's model path", r"def resolve_model_path\b", CODE, ["pcl/data/inputs.py"]),
    ("the sampling parameters of a request", r"(?m)^\s*class \w*SamplingParams\b", CODE, ["pcl/engines/request.py"]),
    ("SamplingParams from its old home", r"from pcl\.engines\.base import (\([^)]*|[^(\n]*)\bSamplingParams\b", CODE, []),
    ("the verified sample", r"(?m)^\s*class Sample\b", CODE, ["pcl/samples.py"]),
    ("Sample through the loop", r"from pcl\.loop\.batch import (\([^)]*|[^(\n]*)\bSample\b", CODE + ("tests",), []),
])
def test_a_rule_has_one_home(rule, pattern, tops, home):
    found = holders(pattern, tops)
    assert found == home, f"{rule}: written in {found}, expected only in {home}"


def test_the_wire_carries_the_engines_sampling_params():
    """The request stream's record holds the engine's own SamplingParams, not a copy of its fields."""
    from typing import get_type_hints

    from pcl.engines.request import SamplingParams
    from services.streams.payloads import RequestRecord

    assert get_type_hints(RequestRecord)["sampling"] is SamplingParams
