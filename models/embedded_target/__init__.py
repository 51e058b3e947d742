"""The embedded target: a tiny Qwen3ForCausalLM trained from scratch on the CPython standard library.

Every machine that runs dspark has a Python interpreter and therefore its standard-library source, so
the target model can be rebuilt anywhere without downloads:

- `corpus`    picks the stdlib `*.py` files (no tests, codec tables or pydoc topic text) and splits them
              into train / held-out by a stable hash of the relative path.
- `tokenizer` trains a byte-level BPE whose id 0 is EOS (`<|endoftext|>`) and id 1 is DSpark's
              `mask_token_id` (`<|mask|>`), and saves it in the layout `AutoTokenizer` and SGLang load.
- `train`     trains the model on packed documents, evaluates held-out perplexity and saves the
              checkpoint with its model card (`card`).

The committed result lives in `embedded/target/`; `dspark embedded-target` reproduces it.
"""
