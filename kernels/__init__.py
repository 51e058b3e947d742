"""dspark.kernels: hot-path ops, each a readable PyTorch reference beside its fast kernel."""
