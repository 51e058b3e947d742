"""Drafter training: data from the target's own generations, anchor sampling, losses and the trainer.

`dspark train` (dspark.ops.commands.train) is the entry point; docs/training.md describes the recipe.
"""
