"""Derive the Helm chart's `settings`, `requestLimits`, `liveness` and `capture` values from their one definitions.

`settings` are the verify-plan settings (models/decoding/settings.py), `requestLimits` the request gate's bounds
(integration/request_limits.py), `liveness` the liveness window (integration/liveness.py), `capture` the capture of
served traffic (integration/capture_settings.py); all are dataclasses of `setting` fields. The chart's own values of
a block (capture's `enabled` and `volume`) are kept as written in the schema, and fields the templates set (the
capture folder: the volume's) are left out. For each, this writes two generated
parts of helm/dspark: `properties.<key>` in values.schema.json (a closed object: each field's JSON type, null
when nullable, choices, numeric bounds, per-position lists) and the documented `<key>:` block of values.yaml
between its BEGIN/END markers (each field's default and help). Bounds that
name gamma or another setting cannot be checked at render time; `dspark serve` checks them when the pod
starts. tests/helm/test_schema.py fails when either part drifts from the schema.

    python scripts/gen_chart_schema.py
"""
from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

from dspark.integration.capture_settings import CaptureSettings
from dspark.integration.liveness import Liveness
from dspark.integration.request_limits import RequestLimits
from dspark.models.decoding.settings import GAMMA, VerifySettings

CHART = Path(__file__).resolve().parents[1] / "helm" / "dspark"
JSON_TYPES = {str: "string", int: "integer", float: "number"}
GENERATED = {"settings": (VerifySettings, "initial runtime state: the settings of models/decoding/settings.py"),
             "requestLimits": (RequestLimits, "the request gate's bounds: integration/request_limits.py"),
             "liveness": (Liveness, "when GET /liveness fails: integration/liveness.py"),
             "capture": (CaptureSettings, "capture of served traffic: integration/capture_settings.py")}
CHART_OWN = {"capture": ("enabled", "volume")}  # values of the chart's own, beside the generated ones
SET_BY_TEMPLATES = {"capture": ("capture",)}


def block(key: str) -> re.Pattern:
    return re.compile(rf"(  # BEGIN {key} \(scripts/gen_chart_schema.py\)\n).*?(  # END {key}\n)", re.S)


def scalar_schema(spec) -> dict:
    out = {"type": JSON_TYPES[spec.kind]}
    if spec.choices:
        out["enum"] = list(spec.choices)
    if isinstance(spec.low, (int, float)):
        out["exclusiveMinimum" if spec.low_open else "minimum"] = spec.low
    if isinstance(spec.high, (int, float)):
        out["maximum"] = spec.high
    return out


def setting_schema(f) -> dict:
    spec = f.metadata["spec"]
    value = scalar_schema(spec)
    if spec.per_position:
        value = {"type": "array", "items": value, "minItems": 1}
    if spec.nullable:
        value = {"anyOf": [value, {"type": "null"}]}
    bound = [b for b in (spec.low, spec.high) if isinstance(b, str)]
    note = f" (checked at start: {' and '.join(GAMMA if b == GAMMA else b for b in bound)})" if bound else ""
    return {"description": f"{spec.help}; {spec.range_text()}{note}", **value}


def generated_fields(key: str, schema: type) -> list:
    return [f for f in fields(schema) if f.name not in SET_BY_TEMPLATES.get(key, ())]


def settings_schema(key: str, schema: type, description: str, own: dict) -> dict:
    return {"type": "object", "additionalProperties": False, "description": description,
            "properties": {**own, **{f.name: setting_schema(f) for f in generated_fields(key, schema)}}}


def values_block(key: str, schema: type) -> str:
    lines = []
    for f in generated_fields(key, schema):
        spec = f.metadata["spec"]
        lines.append(f"  # -- {spec.help}; {spec.range_text()}{'; null allowed' if spec.nullable else ''}")
        lines.append(f"  {f.name}: {json.dumps(f.default)}")
    return "\n".join(lines) + "\n"


def generated_schema(text: str) -> str:
    schema = json.loads(text)
    for key, (settings, description) in GENERATED.items():
        written = schema["properties"].get(key, {}).get("properties", {})
        own = {name: written[name] for name in CHART_OWN.get(key, ())}
        schema["properties"][key] = settings_schema(key, settings, description, own)
    return json.dumps(schema, indent=2) + "\n"


def generated_values(text: str) -> str:
    for key, (settings, _) in GENERATED.items():
        if not block(key).search(text):
            raise SystemExit(f"values.yaml lost its '# BEGIN {key}' / '# END {key}' markers")
        text = block(key).sub(lambda m: m.group(1) + values_block(key, settings) + m.group(2), text)
    return text


def main() -> None:
    for name, generate in (("values.schema.json", generated_schema), ("values.yaml", generated_values)):
        path = CHART / name
        path.write_text(generate(path.read_text()))


if __name__ == "__main__":
    main()
