"""dspark.models: the DSpark drafter, its baselines, training, and the embedded target.

Terms used verbatim across dspark (defined once, here):
- target: the model whose output distribution speculative decoding must reproduce exactly.
- drafter: the small model that proposes a block of gamma draft tokens per round from target features.
- anchor: the last committed token; the first prediction position of a DSpark/DFlash block.
- accepted: draft tokens that pass verification (a prefix of the block).
- recovered: the token sampled from the residual distribution at the first rejected position.
- bonus: the token sampled from the target when every verified draft token was accepted.
- committed: accepted tokens plus the one recovered or bonus token, appended to the request each round.
"""
