"""One module per `dspark` subcommand; see dspark.ops.cli."""
