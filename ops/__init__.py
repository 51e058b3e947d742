"""Operations layer: the `dspark` command line, and (later) the admin control plane, tracing and metrics."""
