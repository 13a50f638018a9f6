"""Prompt templates: how a dataset's raw question becomes the text the policy is asked to continue.

    prompt = apply_template(problem, cfg.data.template, tokenizer)

- "qwen_base": the paper's suffix for base models, `{problem} Let's think step by step and output the final
  answer within \\boxed{}.` (the reward parses the last \\boxed{...}).
- "chat": the tokenizer's own chat template, one user turn carrying the same instruction, ending with the
  assistant header (add_generation_prompt=True), for instruct / chat models.
- "plain": the question exactly as stored.
- "tiny": the synthetic arithmetic task's own format (pcl.tiny.task.format_prompt).
"""

from __future__ import annotations

from typing import Any

QWEN_BASE_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
TEMPLATES = ("qwen_base", "chat", "plain", "tiny")


def apply_template(problem: str, template: str, tokenizer: Any = None) -> str:
    """The prompt text for one question under the named template.

    >>> apply_template("What is 1+1?", "qwen_base")
    "What is 1+1? Let's think step by step and output the final answer within \\\\boxed{}."
    """
    if template == "qwen_base":
        return f"{problem} {QWEN_BASE_INSTRUCTION}"
    if template == "plain":
        return problem
    if template == "chat":
        return _chat_prompt(problem, tokenizer)
    if template == "tiny":
        # Imported late: the tiny task is only needed by runs that use it.
        from pcl.tiny.task import format_prompt

        return format_prompt(problem)
    raise ValueError(f"unknown prompt template {template!r}; allowed: {', '.join(TEMPLATES)}")


def _chat_prompt(problem: str, tokenizer: Any) -> str:
    """One user turn through the tokenizer's chat template, ending where the assistant starts its answer."""
    if tokenizer is None:
        raise ValueError("prompt template 'chat' needs a tokenizer that has a chat template; none was given")
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"prompt template 'chat': tokenizer {name!r} has no chat template; "
            "use data.template=qwen_base (or plain) for a base model"
        )
    messages = [{"role": "user", "content": f"{problem} {QWEN_BASE_INSTRUCTION}"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):
        raise TypeError(f"the tokenizer's chat template returned {type(text).__name__}, expected text")
    return text
