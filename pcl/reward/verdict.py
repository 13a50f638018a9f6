r"""The math reward (algorithm step 5): 1.0 when a response's final answer matches the gold answer.

    >>> math_reward(r"Half of it, so the answer is \boxed{\frac{1}{2}}.", "0.5")
    1.0
    >>> math_reward(r"I get \boxed{26}.", 27.0)
    0.0

The answer is the content of the last brace-matched `\boxed{...}` (or `\fbox{...}`); a response without
one is its own answer when it is a plain number as a whole ("42"), else falls back to math-verify's own
extraction of the whole text. `gold` is a string (LaTeX or plain), a number (AMC golds are floats such as
27.0) or a list/tuple of alternatives (OlympiadBench), any of which counts. When the answer and a gold alternative are both plain numbers they are compared as decimals,
without sympy (integers exactly, others to a relative 1e-6): that is most math answers, and it is two
orders of magnitude faster than math-verify. It is also stricter where math-verify is loose: a number
against a number never goes through its six-decimal float rounding (which makes 8.2e-19 equal 9.2e-19).

A gold of several answers (one math-verify parses to a set: "1, 2", "(1, 2), (2, 1)", "\{1, 2\}",
"x = 1, 2") is scored as math-verify scores it, on its extraction of the whole text, which joins adjacent
boxes: "\boxed{1}, \boxed{2}" and "\boxed{(1, 2)} \text{ and } \boxed{(2, 1)}" score 1.0 (the last box
alone would score 0.0), and, as there, a response whose earlier boxes join into a wrong set scores 0.0.
Elsewhere the last box is the answer: "\boxed{3}, no wait, \boxed{4}" scores 1.0 against 4, where
math-verify alone takes {3, 4}.

A truncated response (one that reached its token budget: finish reason "length") scores 0 and is never
verified (algorithm step 5): `is_truncated` says which, `response_reward` scores one response in-process with
the rule applied, and the reward workers and the evaluation suite skip what `is_truncated` names.

`math_reward` never raises on a model output (a bad one scores 0.0); a bad gold raises ValueError or
TypeError naming it. On the main thread math-verify's own SIGALRM alarm guards each parse and comparison
(it cancels any other alarm the process had set); elsewhere nothing can interrupt sympy in-process, so
production scoring goes through `pcl.reward.pool.RewardPool`, which kills a worker process past a hard
per-sample timeout.
"""

from __future__ import annotations

import numbers
import re
import threading
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation, localcontext
from functools import lru_cache
from typing import Any

__all__ = [
    "is_truncated", "response_reward", "TRUNCATED_REWARD", "math_reward", "score_answer", "normalize_gold", "last_boxed", "boxed_answer", "plain_number",
    "numeric_verdict", "numbers_verdict",
]

# The reward of a truncated response, given without a verdict (algorithm step 5).
TRUNCATED_REWARD = 0.0
# math-verify's own per-call alarm (whole seconds) when math_reward runs on the main thread.
IN_PROCESS_GUARD_S = 5
# Relative tolerance between two plain numbers when either has a fractional part or an exponent; it
# matches math-verify's six-digit float rounding for numbers of order one and stays meaningful for the
# small scientific values of physics answers (1.2e-8 vs 3.4e-8), where absolute rounding would not.
REL_TOLERANCE = Decimal("1e-6")

# One token of the brace scan: an escaped backslash (a LaTeX line break), an escaped brace (a literal
# brace that must not count), a box opener, or a bare brace.
_BRACE_TOKEN = re.compile(r"\\\\|\\[{}]|\\(?:boxed|fbox)\s*\{|[{}]")
# Integers and decimals with an optional sign, thousands commas and exponent: "-1,234.5", ".5", "4.5e33".
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+|(?=\.\d))(?:\.\d+)?(?:[eE][+-]?\d{1,4})?")
# Scientific notation as LaTeX: "8.224 \times 10^{-19}", "3 \cdot 10^8".
_LATEX_SCIENTIFIC = re.compile(
    r"(?P<mantissa>[^\\]+?)\s*\\(?:times|cdot)\s*10\s*\^\s*(?:\{\s*(?P<exponent>[+-]?\d{1,4})\s*\}|(?P<digit>\d))"
)
# LaTeX spellings of a thousands separator or a thin space inside a number: 10{,}000, 10,\!000, 10\,000.
_NUMBER_SPACING = re.compile(r"\{,\}|\\!|\\,|\\ ")


def last_boxed(text: str) -> str | None:
    r"""The content of the last closed `\boxed{...}` / `\fbox{...}` in `text`, or None.

    One left-to-right pass with a stack, so an adversarial run of unclosed openers costs linear time.
    "Last" is the box that closes last: for nested boxes the outermost one.

    >>> last_boxed(r"first \boxed{1}, then \boxed{\frac{a}{\sqrt{b}}} and \boxed{2")
    '\\frac{a}{\\sqrt{b}}'
    """
    open_braces: list[int] = []  # content start of a box opener, or -1 for a plain "{"
    last: tuple[int, int] | None = None
    for token in _BRACE_TOKEN.finditer(text):
        kind = token.group()
        if kind == "}":
            if open_braces:
                start = open_braces.pop()
                if start >= 0:
                    last = (start, token.start())
        elif kind == "{":
            open_braces.append(-1)
        elif len(kind) > 2:  # a \boxed{ or \fbox{ opener; escaped braces and backslashes are skipped
            open_braces.append(token.end())
    return None if last is None else text[last[0] : last[1]]


def plain_number(text: str) -> Decimal | None:
    r"""`text` as a Decimal when it is a plain number: sign, thousands commas, decimals, an exponent
    written 4.5e33 or 4.5 \times 10^{33}. math-verify reads "4.5e33" as 4.5 * e * 33, and rounds floats
    to six decimals, so 8.2 \times 10^{-19} would equal 9.2 \times 10^{-19} there.

    >>> plain_number("1{,}234"), plain_number(r"-8.2 \times 10^{-19}"), plain_number("x+1")
    (Decimal('1234'), Decimal('-8.2E-19'), None)
    """
    text = _NUMBER_SPACING.sub("", text.strip().strip("$").strip())
    if len(text) > 1000:
        return None
    scientific = _LATEX_SCIENTIFIC.fullmatch(text)
    if scientific is not None:
        text = scientific["mantissa"] + "e" + (scientific["exponent"] or scientific["digit"])
    if not _PLAIN_NUMBER.fullmatch(text) or text.count("e") + text.count("E") > 1:
        return None
    try:
        return Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None


def numbers_match(answer: Decimal, gold: Decimal) -> bool:
    """Exact equality for integers, relative tolerance REL_TOLERANCE once either side is fractional."""
    if answer == gold:
        return True
    if answer == answer.to_integral_value() and gold == gold.to_integral_value():
        return False
    with localcontext() as context:
        context.traps = {signal: False for signal in context.traps}  # huge exponents round, not raise
        return abs(answer - gold) <= REL_TOLERANCE * max(abs(answer), abs(gold))


def normalize_gold(gold: Any) -> tuple[str, ...]:
    """The gold answer as a tuple of non-empty alternative strings; ValueError/TypeError names a bad one.

    >>> normalize_gold(27.0), normalize_gold(["$2n$", 0.25])
    (('27',), ('2n', '0.25'))
    """
    if isinstance(gold, (list, tuple)):
        if not gold:
            raise ValueError("gold is an empty list; expected at least one alternative answer")
        return tuple(_gold_text(alternative, f"gold[{i}]") for i, alternative in enumerate(gold))
    return (_gold_text(gold, "gold"),)


def _gold_text(gold: Any, name: str) -> str:
    if gold is None:
        raise ValueError(f"{name} is None; expected a str, a number, or a list of alternatives")
    if not isinstance(gold, str):
        return _number_gold_text(gold, name)
    text = gold.strip()
    boxed = last_boxed(text)
    text = (boxed if boxed is not None else text).strip().strip("$").strip()
    if not text:
        raise ValueError(f"{name} is empty: {gold!r}")
    return text


def _number_gold_text(gold: Any, name: str) -> str:
    if isinstance(gold, bool) or not isinstance(gold, numbers.Real):
        raise TypeError(f"{name} must be a str or a number, got {type(gold).__name__}: {gold!r:.80}")
    if isinstance(gold, numbers.Integral):
        return str(int(gold))
    value = float(gold)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} is not a finite number: {gold!r}")
    if value.is_integer():
        return str(int(value))  # AMC golds: 27.0 means the integer 27
    return format(Decimal(repr(value)), "f")


def is_truncated(finish_reason: str | None) -> bool:
    """Whether a response was cut at its token budget (finish reason "length"): it scores TRUNCATED_REWARD and
    is never verified (a cut response has no final answer).

    >>> is_truncated("length"), is_truncated("stop")
    (True, False)
    """
    return finish_reason == "length"


def response_reward(finish_reason: str | None, response: str, gold: Any) -> float:
    r"""The reward of one finished response, scored in this process: TRUNCATED_REWARD when it was truncated
    (not verified), else `math_reward`.

    >>> response_reward("length", r"\boxed{4}", 4), response_reward("stop", r"\boxed{4}", 4)
    (0.0, 1.0)
    """
    return TRUNCATED_REWARD if is_truncated(finish_reason) else math_reward(response, gold)


def math_reward(response: str, gold: Any) -> float:
    r"""1.0 when the response's final answer matches `gold` per math-verify, else 0.0.

    >>> math_reward(r"Two cases: \boxed{3}, or rather \boxed{4}.", [4, "four"])
    1.0
    >>> math_reward("no answer here at all", "5")
    0.0
    >>> math_reward(r"The solutions are $\boxed{-1}$ and $\boxed{2}$.", ["$2,-1$"])
    1.0
    """
    alternatives = normalize_gold(gold)
    guard_s = IN_PROCESS_GUARD_S if threading.current_thread() is threading.main_thread() else None
    try:
        return score_answer(response, alternatives, guard_s)
    except Exception:  # a model output must never crash the caller; RecursionError, MemoryError included
        return 0.0
    except BaseException as error:  # math-verify's TimeoutException derives from BaseException
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise
        return 0.0


def score_answer(response: str, alternatives: Sequence[str], guard_s: int | None) -> float:
    """The reward of `response` against normalised gold `alternatives`; may raise on hostile input.

    `guard_s` is math-verify's own alarm in whole seconds, or None inside a process that enforces its
    own timeout (math-verify's alarm only works on the main thread).
    """
    answer = boxed_answer(response)
    verdict = _numbers_settle(response, answer, alternatives)
    if verdict is not None:
        return verdict
    # A gold of several answers is scored as math-verify scores it: its extraction of the whole response
    # joins the boxes "\boxed{1}, \boxed{2}", which the last box alone would miss.
    several = [gold for gold in alternatives if _several_answers(_parse_gold(gold, guard_s))]
    if several and isinstance(response, str) and _verifies(several, _parse(response, guard_s), guard_s):
        return 1.0
    single = [gold for gold in alternatives if gold not in several]
    return _last_box_score(response, answer, single, guard_s) if single else 0.0


def _last_box_score(response: Any, answer: str | None, alternatives: list[str], guard_s: int | None) -> float:
    """The last boxed answer against `alternatives`; math-verify's extraction of a response without one."""
    if answer is not None:
        if plain_number(answer) is not None:
            # A number needs sympy only against golds that are not numbers; golds in free symbols
            # (2n + 1, \text{Evelyn}) never equal one, and sympy's simplify takes seconds to say so.
            alternatives = [g for g in alternatives if plain_number(g) is None]
            alternatives = [g for g in alternatives if not _in_free_symbols(_parse_gold(g, guard_s))]
            if not alternatives:
                return 0.0
        predicted = _parse(f"\\boxed{{{answer}}}", guard_s) if answer else []
    else:
        predicted = _parse(response, guard_s) if isinstance(response, str) else []
    return 1.0 if _verifies(alternatives, predicted, guard_s) else 0.0


def _verifies(alternatives: Sequence[str], predicted: list, guard_s: int | None) -> bool:
    """True when math-verify finds the parsed response equal to any gold alternative."""
    if not predicted:
        return False
    from math_verify import verify

    for gold in alternatives:
        parsed_gold = _parse_gold(gold, guard_s)
        if parsed_gold and verify(parsed_gold, predicted, timeout_seconds=guard_s):
            return True
    return False


def boxed_answer(response: Any) -> str | None:
    """The last boxed answer of a response, without surrounding dollars and spaces; None if unboxed."""
    answer = last_boxed(response) if isinstance(response, str) else None
    return None if answer is None else answer.strip().strip("$").strip()


def numbers_verdict(response: Any, alternatives: Sequence[str]) -> float | None:
    """The reward when plain numbers settle it, else None: the response's answer is its last box, or, in a
    response without one, the whole response when that is a plain number ("42", the short answers of a
    model that answers alone). Linear in the input, no sympy: safe anywhere."""
    return _numbers_settle(response, boxed_answer(response), alternatives)


def _numbers_settle(response: Any, answer: str | None, alternatives: Sequence[str]) -> float | None:
    """`numbers_verdict` given the response's boxed answer (None: unboxed), already found."""
    if answer is None:
        if not isinstance(response, str):
            return None
        answer = response
    return numeric_verdict(answer, alternatives)


def numeric_verdict(answer: str, alternatives: Sequence[str]) -> float | None:
    """1.0 or 0.0 when plain numbers settle it (the answer equals a numeric gold, or the answer and all
    golds are numbers), None when sympy must decide. Linear in the input, no sympy: safe anywhere."""
    answer_number = plain_number(answer)
    if answer_number is None:
        return None
    gold_numbers = [plain_number(gold) for gold in alternatives]
    if any(gold is not None and numbers_match(answer_number, gold) for gold in gold_numbers):
        return 1.0
    return 0.0 if all(gold is not None for gold in gold_numbers) else None


def _several_answers(parsed_gold: list) -> bool:
    """True when a gold parses to a set of answers: "1, 2", "(1, 2), (2, 1)", "\\{1, 2\\}", "x = 1, 2" (x
    equal to a set), and "-2, -2", whose set has one element."""
    from sympy import Eq, FiniteSet

    return any(
        isinstance(form, FiniteSet) or (isinstance(form, Eq) and isinstance(form.rhs, FiniteSet))
        for form in parsed_gold
    )


def _in_free_symbols(parsed_gold: list) -> bool:
    """True when every parsed form of a gold is an expression with free symbols (not an equation or set)."""
    from sympy import Expr

    forms = [form for form in parsed_gold if not isinstance(form, str)]
    return bool(forms) and all(isinstance(form, Expr) and form.free_symbols for form in forms)


def _parse(text: str, guard_s: int | None) -> list:
    from math_verify import parse

    return parse(text, parsing_timeout=guard_s)  # default targets: LaTeX first, then plain expressions


@lru_cache(maxsize=4096)
def _parse_gold(gold: str, guard_s: int | None) -> list:
    # A step scores n responses per prompt against the same gold: parse it once.
    return _parse(f"\\boxed{{{gold}}}", guard_s)
