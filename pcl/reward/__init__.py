"""The reward (algorithm step 5): the verdict on one response, and the pool of worker processes that scores."""
