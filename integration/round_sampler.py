"""An even spread of rounds at a live ratio: round n (counting from 1) is taken when
floor(n * ratio) > floor((n - 1) * ratio), so a ratio of 0.1 takes every tenth round and a changed ratio applies
from the next round. Deterministic: tensor-parallel ranks that count the same rounds take the same ones."""
from __future__ import annotations

import math


class RoundSampler:
    def __init__(self):
        self.rounds = 0

    def take(self, ratio: float) -> bool:
        self.rounds += 1
        return math.floor(self.rounds * ratio) > math.floor((self.rounds - 1) * ratio)
