"""dspark.admin.v1 messages <-> the settings schema's dicts (models/decoding/settings.py).

A `Settings` message carries a setting by presence: an `optional` field that is set has a value, an unset one
is null (for the repeated sts_temperatures: an empty list). An update names its settings in `update_mask`;
paths that are not settings are refused by name (clipped: a path may be a megabyte) rather than ignored, as are
fields the server does not know or of a wrong wire type, in every request message (wire.py).
"""
from __future__ import annotations

from typing import Any, Optional

from google.protobuf import field_mask_pb2

from dspark.models.decoding.settings import names, spec_of
from dspark.models.errors import ConfigError, shown
from dspark.ops.admin.v1 import admin_pb2 as pb


def settings_to_message(values: dict) -> pb.Settings:
    message = pb.Settings()
    for name in names():
        value = values.get(name)
        if value is None:
            continue
        if spec_of(name).per_position:
            getattr(message, name).extend(value)
        else:
            setattr(message, name, value)
    return message


def message_to_settings(message: pb.Settings, paths: Optional[list[str]] = None) -> dict:
    """{name: value or None} for the settings in `paths` (default: every setting)."""
    chosen = list(paths) if paths is not None else list(names())
    unknown = sorted(set(chosen) - set(names()))
    if unknown:
        raise ConfigError(f"update_mask names unknown setting(s) {shown(unknown)}; known: {list(names())}")
    return {name: field_value(message, name) for name in chosen}


def field_value(message: pb.Settings, name: str) -> Any:
    if spec_of(name).per_position:
        return list(getattr(message, name)) or None
    return getattr(message, name) if message.HasField(name) else None


def state_message(report: dict) -> pb.State:
    """A replica's dspark report (/server_info) as a State."""
    drafter = report.get("drafter")
    return pb.State(settings=settings_to_message(report), version=report["version"], gamma=report["gamma"],
                    last_rejection=report.get("last_rejection") or "",
                    sps_table_source=report.get("sps_table_source") or "",
                    drafter=drafter_message(drafter) if drafter else None)


def drafter_message(drafter: dict) -> pb.Drafter:
    """A scheduler's drafter record (integration/drafter_swap.py) as a Drafter."""
    return pb.Drafter(path=drafter["path"], version=drafter["version"], loaded_at_unix_s=drafter["loaded_at"],
                      swaps=drafter["swaps"])


def update_mask(*paths: str) -> field_mask_pb2.FieldMask:
    return field_mask_pb2.FieldMask(paths=list(paths))
