"""Operations layer: the `dspark` command line (cli.py, commands/), the harnesses that measure and stress it
(harness/), and the gRPC admin control plane (admin/). The top layer: it imports integration, models and kernels,
and nothing below imports it (docs/architecture.md)."""
