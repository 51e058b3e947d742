"""Speculative decoding: the engine (engine.py), the target's ragged KV cache (target.py), verification-length
policies (verify_length.py) and STS calibration (sts.py). The acceptance rule itself is kernels/verification.py."""
