"""Command-line flags for the verify-plan settings, generated from their one definition.

Every field of `VerifySettings` (models/decoding/settings.py) becomes `--<name with dashes>` with the field's
default, choices and help (its range included); `settings_from_args` turns the parsed flags back into a
validated VerifySettings, so a bad value is reported by the schema's own check (a float flag refuses NaN and
infinities as it parses: arg_types.finite_float). The decoding commands
(generate, eval, calibrate, demo) and `dspark serve` share these flags, and tests/ops/test_settings_schema.py
checks each parser against the schema.
"""
from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from dspark.models.decoding.settings import VerifySettings
from dspark.ops.arg_types import finite_float

TITLE = "verification plan (models/decoding/settings.py; live-tunable when served)"


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_settings_args(parser: argparse.ArgumentParser, title: str = TITLE, defaults: dict | None = None,
                      only: tuple[str, ...] | None = None, schema: type = VerifySettings) -> None:
    """The flags of every setting (or of those in `only`), with the schema's defaults unless `defaults` names a
    command's own (`dspark eval` drafts every round: it measures acceptance). `schema`: another dataclass of
    `setting` fields, such as `dspark serve`'s request limits (integration/request_limits.py)."""
    group = parser.add_argument_group(title)
    for f in fields(schema):
        if only is not None and f.name not in only:
            continue
        spec, default = f.metadata["spec"], (defaults or {}).get(f.name, f.default)
        options = dict(default=default, help=f"{spec.help}; {spec.range_text()} (default: {default})")
        if spec.choices:
            options["choices"] = spec.choices
        if spec.per_position:
            options.update(nargs="+", metavar="T")
        if spec.per_position and spec.kind is str:  # a list of strings (capture_redact): the flag also repeats
            options.update(action="extend", metavar="VALUE")
        options["type"] = nullable(spec.kind, spec.nullable)
        group.add_argument(flag(f.name), dest=f.name, **options)


def values_from_args(args: argparse.Namespace, schema: type):
    """The `schema` instance the flags of `add_settings_args(..., schema=schema)` ask for, validated (lists as
    tuples: the instances are frozen)."""
    values = {f.name: getattr(args, f.name) for f in fields(schema)}
    return schema(**{name: tuple(v) if isinstance(v, list) else v for name, v in values.items()})


def add_settings_patch_args(parser: argparse.ArgumentParser, title: str) -> None:
    """The same flags for a partial change (`dspark admin set`): only the flags given are changed, and
    `null` sets a nullable setting to null."""
    group = parser.add_argument_group(title)
    for f in fields(VerifySettings):
        spec = f.metadata["spec"]
        options = dict(default=argparse.SUPPRESS, help=f"{spec.help}; {spec.range_text()}"
                       f"{'; null allowed' if spec.nullable else ''}", type=nullable(spec.kind, spec.nullable))
        if spec.choices:
            options["choices"] = spec.choices
        if spec.per_position:
            options.update(nargs="+", metavar="T")
        group.add_argument(flag(f.name), dest=f.name, **options)


def nullable(kind: type, allowed: bool):
    """The argparse type of a setting's kind (a float: finite_float), taking `null` when `allowed`."""
    convert = finite_float if kind is float else kind

    def parse(text: str):
        return None if allowed and text == "null" else convert(text)
    parse.__name__ = kind.__name__  # argparse names the type in its error message
    return parse


def settings_patch(args: argparse.Namespace) -> dict:
    """{name: value} of the settings flags that were given (per-position lists: [null] -> null)."""
    patch = {f.name: getattr(args, f.name) for f in fields(VerifySettings) if hasattr(args, f.name)}
    if patch.get("sts_temperatures") == [None]:
        patch["sts_temperatures"] = None
    return patch


def settings_from_args(args: argparse.Namespace) -> VerifySettings:
    """The VerifySettings the flags ask for (paths made absolute); a ConfigError names a bad value."""
    values = {f.name: getattr(args, f.name) for f in fields(VerifySettings)}
    if values["sps_table"] is not None:
        values["sps_table"] = str(Path(values["sps_table"]).resolve())
    if values["sts_temperatures"] is not None:
        values["sts_temperatures"] = tuple(values["sts_temperatures"])
    return VerifySettings(**values)
