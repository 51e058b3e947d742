"""Derive the Helm chart's `settings` values from the one settings schema (models/decoding/settings.py).

Writes two generated parts of helm/dspark: `properties.settings` in values.schema.json (a closed object: each
setting's JSON type, null when nullable, choices, numeric bounds, per-position lists) and the documented
`settings:` block of values.yaml between its BEGIN/END markers (each setting's default and help). Bounds that
name gamma or another setting cannot be checked at render time; `dspark serve` checks them when the pod
starts. tests/helm/test_schema.py fails when either part drifts from the schema.

    python scripts/gen_chart_schema.py
"""
from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

from dspark.models.decoding.settings import GAMMA, VerifySettings

CHART = Path(__file__).resolve().parents[1] / "helm" / "dspark"
JSON_TYPES = {str: "string", int: "integer", float: "number"}
BLOCK = re.compile(r"(  # BEGIN settings \(scripts/gen_chart_schema.py\)\n).*?(  # END settings\n)", re.S)


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


def settings_schema() -> dict:
    return {"type": "object", "additionalProperties": False,
            "description": "initial runtime state: the settings of models/decoding/settings.py",
            "properties": {f.name: setting_schema(f) for f in fields(VerifySettings)}}


def values_block() -> str:
    lines = []
    for f in fields(VerifySettings):
        spec = f.metadata["spec"]
        lines.append(f"  # -- {spec.help}; {spec.range_text()}{'; null allowed' if spec.nullable else ''}")
        lines.append(f"  {f.name}: {json.dumps(f.default)}")
    return "\n".join(lines) + "\n"


def generated_schema(text: str) -> str:
    schema = json.loads(text)
    schema["properties"]["settings"] = settings_schema()
    return json.dumps(schema, indent=2) + "\n"


def generated_values(text: str) -> str:
    if not BLOCK.search(text):
        raise SystemExit("values.yaml lost its '# BEGIN settings' / '# END settings' markers")
    return BLOCK.sub(lambda m: m.group(1) + values_block() + m.group(2), text)


def main() -> None:
    for name, generate in (("values.schema.json", generated_schema), ("values.yaml", generated_values)):
        path = CHART / name
        path.write_text(generate(path.read_text()))


if __name__ == "__main__":
    main()
