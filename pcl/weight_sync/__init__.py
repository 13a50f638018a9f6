"""Moving the learner's weights to the rollout engines: the torch.distributed group of the collective route."""
