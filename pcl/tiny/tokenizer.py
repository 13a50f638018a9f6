"""The tiny task's character-level tokenizer: one token per digit, operator or '=', plus specials.

    tokenizer = build_tokenizer()            # a transformers.PreTrainedTokenizerFast
    tokenizer.save_pretrained(path)          # AutoTokenizer.from_pretrained(path) loads it back
    tokenizer("12+345=").input_ids           # [bos, '1', '2', '+', '3', '4', '5', '=']

Encoding prepends `<bos>` (a fixed first position for the tiny policy) and never appends `<eos>`, so an
encoded prompt is ready for generation; the policy ends its answer with `<eos>` itself. Whitespace is
dropped before tokenising, so "12 + 3 =" and "12+3=" encode alike. Decoding with
`skip_special_tokens=True` gives the characters back joined without spaces ("407").
Padding is on the left by default: the tokenizer's main client is batched generation.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# The symbols of the task's problems and answers; '-' and '*' keep room for other operations.
SYMBOLS = tuple("0123456789") + ("+", "-", "*", "=")
VOCAB: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + SYMBOLS)}
BOXED = "\\boxed{"  # the opener of a boxed answer, one token where a task uses it


def build_tokenizer(symbols: tuple[str, ...] = SYMBOLS, max_length: int = 64) -> PreTrainedTokenizerFast:
    """The character-level tokenizer: the 4 specials, then `symbols` (default SYMBOLS: 18 tokens in all).

    A symbol is one character, or the one multi-character token BOXED ("\\boxed{"), which the scratchpad task
    (pcl.tiny.tasks) adds with ',' and '}' so that its answer is one token plus the digits and '}'.
    `max_length` is the tokenizer's model_max_length."""
    if len(set(symbols)) != len(symbols) or any(len(s) != 1 and s != BOXED for s in symbols):
        raise ValueError(f"symbols must be distinct single characters (or {BOXED!r}), got {symbols!r}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(symbols))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.normalizer = normalizers.Replace(Regex(r"\s+"), "")
    # Every character is its own pre-token (BOXED too, when it is a symbol), so the word-level model sees
    # single characters.
    pattern = (r"\\boxed\{|." if BOXED in symbols else ".")
    core.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, VOCAB[BOS])]
    )
    # Fuse joins the decoded characters with nothing between them (the default joins with spaces).
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
