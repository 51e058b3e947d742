"""User-facing errors.

Every error a user can cause (a malformed or mismatched checkpoint, an invalid setting, a missing file)
is a `DsparkError` whose message names the field, the rule, the value seen and the fix. The CLI prints
these as one line; anything else is a bug and keeps its traceback.
"""


class DsparkError(Exception):
    """Base class of errors caused by bad input rather than by a bug."""


class CheckpointError(DsparkError):
    """A checkpoint is missing, malformed, or does not fit the target it is used with."""


class ConfigError(DsparkError):
    """A setting is out of range or inconsistent with another."""
