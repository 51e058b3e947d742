"""The harnesses: commands that measure or stress the product rather than use it (`dspark bench`, `bench-sched`,
`bench-serve`, `bench-trace`, `soak`, `gpu-check`). Their results go under bench/results/ (docs/benchmarks.md).
"""
