"""stop_regex bounded in the gate and in the scheduler.

SGLang 0.5.23 runs Python's backtracking `re.search` over the end of the output at every decode step, in the
scheduler. Two things made that a stall: a pattern whose backtracking is exponential (`([\\s\\S]|[\\s\\S])*\\x01`,
25 characters, held the scheduler for good), and the window, which for any unbounded pattern (`*`, `+`, `{n,}`)
is the whole output, so even a polynomial pattern costs more at every step.

    the gate       refuses a pattern that is not valid (`(`: SGLang answered 500), longer than SGLang's own
                   256 bytes, or shaped for catastrophic backtracking (`unsafe_reason`): a variable-length
                   repeat inside another, an alternation inside a variable-length repeat whose branches can
                   start alike (or match nothing), or more than MAX_VARIABLE_REPEATS variable-length repeats
    the window     `clamp_window` (AFTER SamplingParams.normalize, in the launcher, before the request reaches
                   the scheduler) caps the tokens each step matches against at `stop_regex_window`, so what a
                   pattern that passed may cost per step is bounded by the window, whatever the output's length

What is left per step is polynomial in the window with a degree of at most MAX_VARIABLE_REPEATS + 1.
"""
from __future__ import annotations

import re
from typing import Any, Optional

try:
    import re._parser as sre_parse
except ImportError:  # Python < 3.11
    import sre_parse

MAX_STOP_REGEX_BYTES = 256  # SGLang 0.5.23's own MAX_STOP_REGEX_LEN, said here first
MAX_STOP_REGEXES = 32  # SGLang's MAX_STOP_REGEX_COUNT
MAX_VARIABLE_REPEATS = 2
REPEATS = (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, getattr(sre_parse, "POSSESSIVE_REPEAT", sre_parse.MAX_REPEAT))
ANY_START = None  # a branch whose first character this analysis does not pin down


def first_chars(items) -> Any:
    """A hashable description of what the first character of `items` can be: ('lit', code), ('set', items) or
    ANY_START; '' when `items` can match the empty string."""
    for op, av in items:
        if op is sre_parse.AT:  # zero-width
            continue
        if op is sre_parse.LITERAL:
            return ("lit", av)
        if op is sre_parse.SUBPATTERN:
            return first_chars(av[-1])
        return ANY_START
    return ""


def branches_overlap(branches: list) -> bool:
    """Whether two branches of an alternation can start alike (as far as literals tell) or match nothing."""
    starts = [first_chars(branch) for branch in branches]
    if "" in starts or ANY_START in starts:
        return True
    return len(set(starts)) < len(starts)


def walk(items, in_repeat: bool, counts: dict) -> Optional[str]:
    for op, av in items:
        if op in REPEATS:
            low, high, body = av
            variable = low != high
            if variable:
                counts["variable"] += 1
                if in_repeat:
                    return "it nests a variable-length repeat inside another (catastrophic backtracking)"
            found = walk(body, in_repeat or variable, counts)
            if found:
                return found
        elif op is sre_parse.BRANCH:
            if in_repeat and branches_overlap(av[1]):
                return ("it repeats an alternation whose branches can match alike (catastrophic "
                        "backtracking)")
            for branch in av[1]:
                found = walk(branch, in_repeat, counts)
                if found:
                    return found
        elif op is sre_parse.SUBPATTERN:
            found = walk(av[-1], in_repeat, counts)
            if found:
                return found
        elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
            found = walk(av[1], in_repeat, counts)
            if found:
                return found
        elif op is sre_parse.GROUPREF_EXISTS:
            for branch in av[1:]:
                found = walk(branch or [], in_repeat, counts)
                if found:
                    return found
    return None


def unsafe_reason(pattern: str) -> Optional[str]:
    """Why `pattern` may not be a stop_regex; None when it may."""
    size = len(pattern.encode("utf-8", "surrogatepass"))
    if size > MAX_STOP_REGEX_BYTES:
        return f"it is {size} bytes, over {MAX_STOP_REGEX_BYTES}"
    try:
        re.compile(pattern)
        tree = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError) as err:
        return f"it is not a valid regular expression ({err})"
    counts = {"variable": 0}
    found = walk(tree, False, counts)
    if found:
        return found
    if counts["variable"] > MAX_VARIABLE_REPEATS:
        return (f"it has {counts['variable']} variable-length repeats, over {MAX_VARIABLE_REPEATS} (each "
                f"multiplies the backtracking)")
    return None


def stop_regex_problem(value: Any) -> Optional[str]:
    """The refusal message for a stop_regex value (a string or a list of strings); None when it passes."""
    from dspark.models.errors import shown

    patterns = [value] if isinstance(value, str) else value if isinstance(value, list) else None
    if value is None:
        return None
    if patterns is None or not all(isinstance(p, str) for p in patterns):
        return f"stop_regex must be a string or a list of strings, got {shown(value)}"
    if len(patterns) > MAX_STOP_REGEXES:
        return f"stop_regex may hold at most {MAX_STOP_REGEXES} patterns, got {len(patterns)}"
    for pattern in patterns:
        reason = unsafe_reason(pattern)
        if reason:
            return f"stop_regex {shown(pattern)} is refused: {reason}"
    return None


def window_clamp(window: int):
    """The hook, AFTER SamplingParams.normalize, that caps the stop_regex window at `window` tokens (module
    docstring). SGLang matches over max(stop string tokens, stop_regex_max_len) + 1 tokens, and an unbounded
    pattern asks for 2**30."""
    def clamp(_result, params, *args, **kwargs) -> None:
        if params.stop_regex_max_len > window:
            params.stop_regex_max_len = window
    return clamp
