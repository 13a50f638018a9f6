"""The tiny synthetic tasks (README.md) of the embedded default, in five modules:

- `pcl.tiny.task`: additions of 1- to 4-digit numbers graded by difficulty, `make_dataset`, `format_prompt`;
- `pcl.tiny.carry`: the scratchpad task in the paper's regime (`data.source: tiny-carry`), and `pcl.tiny.tasks`,
  the registry of both task families by name;
- `pcl.tiny.tokenizer`: the character-level tokenizer, saved as a Hugging Face tokenizer;
- `pcl.tiny.build`: `build_tiny` (`pcl make-tiny`), which warm-starts a tiny Qwen3 policy and caches it
  under `tiny_dir(seed)`.

Nothing is imported here, so `pcl.tiny.task` stays importable without torch.
"""
