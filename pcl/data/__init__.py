"""Prompt data: raw rows, named datasets, templates, prompt sets, the sampler, fingerprints, reference pass rates."""
