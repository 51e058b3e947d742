"""Settings that `dspark serve` hands to SGLang's processes as JSON in one environment variable each.

A subclass is a frozen dataclass of `setting` fields (models/decoding/settings.py: each field's one definition)
with the name of its variable in ENV_VAR. Its values are checked when it is made, so a bad flag stops
`dspark serve` and a bad hand-over stops the plugin where it installs, naming the setting:
request_limits.py (the request gate's bounds) and liveness.py (the liveness window) are the two.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from typing import ClassVar

from dspark.models.decoding.settings import check_value
from dspark.models.errors import ConfigError


class EnvSettings:
    ENV_VAR: ClassVar[str]

    def __post_init__(self) -> None:
        for f in fields(self):
            check_value(f.name, getattr(self, f.name), f.metadata["spec"], self)

    @classmethod
    def from_env(cls):
        """The values `dspark serve` handed over (the defaults when it handed none); a ConfigError names a bad
        one."""
        try:
            raw = json.loads(os.environ.get(cls.ENV_VAR) or "{}")
        except json.JSONDecodeError as err:
            raise ConfigError(f"{cls.ENV_VAR} is not JSON: {err}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{cls.ENV_VAR} must be a JSON object")
        unknown = sorted(set(raw) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"unknown setting(s) {unknown} in {cls.ENV_VAR}")
        return cls(**raw)

    def to_env(self) -> dict[str, str]:
        return {self.ENV_VAR: json.dumps(asdict(self))}
