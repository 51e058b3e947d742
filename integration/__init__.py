"""The SGLang layer: how dspark runs inside SGLang 0.5.23 (server launch recipe, CPU support, plugin)."""
