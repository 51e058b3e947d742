"""Evaluation the way DeepSpec measures it (DEEPSPEC_REFERENCE.md §3): prompts (datasets.py), acceptance and
confidence-calibration metrics pooled over rounds (metrics.py), the evaluation run (run.py) and its plots
(plots.py)."""
