"""A step's rewards that are verifier errors rather than verdicts: beyond `verifier.max_error_share` the step fails.

    check_verifier_errors(step, errors, total, cfg.verifier.max_error_share)   # TooManyVerifierErrors, or nothing

The rollout client (`services.streams.rollout_client`) and the in-process rollouts (`pcl.loop.local.ports`) check every
generation call's samples with it.
"""

from __future__ import annotations


class TooManyVerifierErrors(RuntimeError):
    """More of a step's rewards are verifier errors than verifier.max_error_share allows."""


def check_verifier_errors(step: int, errors: int, total: int, max_share: float) -> None:
    """Raise TooManyVerifierErrors when errors / total exceeds max_share: a sick verifier's zeros are not
    rewards, and training on them would silently teach the policy that correct answers are wrong."""
    if total and errors > max_share * total:
        raise TooManyVerifierErrors(
            f"step {step}: {errors} of {total} rewards ({errors / total:.0%}) are verifier errors, not verdicts, "
            f"above verifier.max_error_share={max_share:g}; not training on them (the verifiers' logs name the "
            f"errors; pcl_verifier_errors_total counts them)")
