"""`dspark chat-prompts` writes the built-in generator's prompts as a file `dspark regenerate` reads."""
import json

from dspark.models.embedded_target.corpus import default_stdlib_root, load_corpus
from dspark.models.training.chat_prompts import generate_chat_prompts
from dspark.models.training.conversations import conversation_from_record
from dspark.ops.cli import main


def test_the_file_is_the_generators_draw_and_every_record_reads_as_a_conversation(tmp_path):
    out = tmp_path / "prompts" / "chat.jsonl"
    assert main(["chat-prompts", "--count", "30", "--seed", "3", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records == generate_chat_prompts(load_corpus(default_stdlib_root()), 30, seed=3)
    assert len({r["turns"][0] for r in records}) == 30
    for record in records:
        assert conversation_from_record(record, "chat.jsonl")[0]["role"] == "user"


def test_a_count_out_of_bounds_is_refused_naming_the_flag_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "chat.jsonl"
    assert main(["chat-prompts", "--count", "2", "--out", str(out)]) == 2
    assert "--count must be in [3, 1000000], got 2" in capsys.readouterr().err and not out.exists()
