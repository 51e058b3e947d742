"""Regenerate ops/admin/v1/admin_pb2.py and admin_pb2_grpc.py from admin.proto (`make proto`).

protoc names the generated imports after the proto's path under its include root, so the proto is compiled
as dspark/ops/admin/v1/admin.proto: the generated code then imports `dspark.ops.admin.v1.admin_pb2`, the
package the repo installs.
"""
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent.parent / "ops" / "admin" / "v1"
PACKAGE = Path("dspark/ops/admin/v1")

with tempfile.TemporaryDirectory() as tmp:
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
