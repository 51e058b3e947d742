"""Generated from admin.proto by scripts/gen_proto.py (`make proto`); edit the proto, not these files."""
