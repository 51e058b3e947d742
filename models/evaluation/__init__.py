"""Evaluation the way DeepSpec measures it (docs/evaluation.md): acceptance pooled over rounds (acceptance.py),
the evaluation run (run.py) and its plots (plots.py), teacher-forced acceptance (teacher_forced.py), paired speed
ratios (paired.py), the scheduling benchmark and its simulator (scheduling.py, simulate.py), and what a machine's
costs allow a drafter (speedup_bound.py). The prompts are read by models/prompts.py, the calibration metrics
computed by models/calibration.py."""
