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
