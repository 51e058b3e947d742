"""The API keys are redacted from the server-args dict SGLang logs and serves (integration/redaction.py)."""
from dspark.integration.redaction import redacted


def test_set_keys_and_their_flags_in_the_launch_command_are_redacted_and_nothing_else():
    args = {"api_key": None, "admin_api_key": "s3cret", "port": 30000,
            "launch_command": "python -m sglang.launch_server --admin-api-key s3cret --api-key=k2 --port 30000"}
    clean = redacted(args)
    assert clean == {"api_key": None, "admin_api_key": "<redacted>", "port": 30000,
                     "launch_command": "python -m sglang.launch_server --admin-api-key <redacted> "
                                       "--api-key=<redacted> --port 30000"}
    assert args["admin_api_key"] == "s3cret"  # the server's own arguments are untouched


SECRET_NAMES = ("api_key", "admin_api_key", "ssl_keyfile_password", "watermark_key", "hf_token", "Client_Secret",
                "db_passwd")
READABLE_NAMES = ("tokenizer_path", "skip_tokenizer_init", "max_total_tokens", "speculative_token_map",
                  "ssl_keyfile", "ssl_certfile", "speculative_num_draft_tokens", "tokenizer_worker_num")


def test_every_secret_like_name_is_redacted_and_names_that_merely_contain_a_secret_word_are_not():
    args = {**{name: "v-" + name for name in SECRET_NAMES + READABLE_NAMES},
            "launch_command": " ".join(f"--{name.replace('_', '-')} v-{name}" for name in SECRET_NAMES + READABLE_NAMES)
            + " --ssl-keyfile-password='two words' --HF-TOKEN=\"quoted value\""}
    clean = redacted(args)
    assert all(clean[name] == "<redacted>" for name in SECRET_NAMES)
    assert all(clean[name] == "v-" + name for name in READABLE_NAMES)
    command = clean["launch_command"]
    assert not any(f"v-{name}" in command for name in SECRET_NAMES) and "two words" not in command
    assert "quoted value" not in command and "--ssl-keyfile-password=<redacted>" in command
    assert all(f"--{name.replace('_', '-')} v-{name}" in command for name in READABLE_NAMES)
