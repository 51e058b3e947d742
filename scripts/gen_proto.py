"""Regenerate the admin API's code from admin.proto (`make proto`), after writing the proto's `Settings` message
from the one settings definition (models/decoding/settings.py).

`Settings` is generated between its BEGIN/END markers: one optional field per setting (repeated for a
per-position one), numbered in the settings' order, with its default (as JSON) and range as options. Numbers are
positions, so a new setting goes at the end of `VerifySettings` (a wire-compatible change).

protoc names the generated imports after the proto's path under its include root, so the proto is compiled as
dspark/ops/admin/v1/admin.proto: the generated code then imports `dspark.ops.admin.v1.admin_pb2`, the package the
repo installs. tests/ops/test_settings_schema.py fails when the committed proto or code drift.

    python scripts/gen_proto.py
"""
from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from dataclasses import fields
from pathlib import Path

from dspark.models.decoding.settings import VerifySettings

HERE = Path(__file__).resolve().parent.parent / "ops" / "admin" / "v1"
PACKAGE = Path("dspark/ops/admin/v1")
PROTO_TYPES = {str: "string", int: "int64", float: "double"}
BLOCK = re.compile(r"(message Settings \{  // BEGIN Settings \(scripts/gen_proto.py\)\n).*?(\}  // END Settings\n)", re.S)


def settings_fields() -> str:
    lines = []
    for number, f in enumerate(fields(VerifySettings), start=1):
        spec = f.metadata["spec"]
        label = "repeated" if spec.per_position else "optional"
        default = json.dumps(json.dumps(f.default))  # the default as JSON, quoted as a proto string
        lines.append(f"  {label} {PROTO_TYPES[spec.kind]} {f.name} = {number} [(setting_default) = {default}, "
                     f"(setting_range) = {json.dumps(spec.range_text())}];")
    return "\n".join(lines) + "\n"


def generated_proto(text: str) -> str:
    if not BLOCK.search(text):
        raise SystemExit("admin.proto lost its `message Settings {  // BEGIN Settings` / `}  // END Settings` lines")
    return BLOCK.sub(lambda m: m.group(1) + settings_fields() + m.group(2), text)


def compile_proto() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        from grpc_tools import protoc

        root, out = Path(tmp) / "src", Path(tmp) / "out"
        (root / PACKAGE).mkdir(parents=True)
        out.mkdir()
        shutil.copy(HERE / "admin.proto", root / PACKAGE / "admin.proto")
        include = Path(protoc.__file__).parent / "_proto"
        code = protoc.main(["protoc", f"-I{root}", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}",
                            f"--grpc_python_out={out}", str(PACKAGE / "admin.proto")])
        if code:
            sys.exit(code)
        for generated in (out / PACKAGE).iterdir():
            shutil.copy(generated, HERE / generated.name)
            print(f"wrote {HERE / generated.name}")


def main() -> None:
    proto = HERE / "admin.proto"
    proto.write_text(generated_proto(proto.read_text()))
    compile_proto()


if __name__ == "__main__":
    main()
