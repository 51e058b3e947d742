"""The command line that reproduces a run, as the cards and train logs it writes record it."""
from __future__ import annotations

import argparse
import shlex

from dspark.models.portable_paths import portable


def reproduce_command(command: str, parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """`dspark <command>` with every option that has a value spelled out, in the parser's order (flags only when
    set, unset options left out; values as `shown`)."""
    parts = ["dspark", command]
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if not action.option_strings or action.dest == "help" or value is None or value is False:
            continue
        flag = action.option_strings[0]
        if value is True:
            parts.append(flag)
        elif isinstance(value, list):
            parts += [flag, *map(portable, value)]
        else:
            parts += [flag, shown(value)]
    return shlex.join(parts)


def shown(value) -> str:
    """A float that is a whole number without its '.0' (--minutes 40), any other float in full, a path portable."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(value) if isinstance(value, float) else portable(value)
