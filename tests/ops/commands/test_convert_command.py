"""`dspark convert`, and what `dspark check` and `dspark serve` say of a drafter in another trainer's layout."""
import json

import pytest
from safetensors.torch import load_file, save_file

from dspark.ops.cli import main

from tests.paths import EMBEDDED, EMBEDDED_TARGET

SERVE = ["serve", "--target", str(EMBEDDED_TARGET), "--device", "cpu", "--dry-run"]


@pytest.fixture
def speculators_753(tmp_path):
    """The committed DSpark drafter as a speculators fill-in export edited for SGLang by config only (speculators
    #753): Qwen3DSparkModel, flat, speculators_model_type kept, the slot convention left unsaid; block_size 6 is
    gamma 5 plus the anchor slot."""
    config = json.loads((EMBEDDED / "dspark" / "config.json").read_text())
    config.pop("sample_from_anchor")
    config.update(block_size=config["block_size"] + 1, speculators_model_type="dspark",
                  speculators_config={"algorithm": "dspark", "proposal_methods": [{"speculative_tokens": 5}]})
    source = tmp_path / "speculators"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(config))
    save_file(load_file(str(EMBEDDED / "dspark" / "model.safetensors")), str(source / "model.safetensors"))
    return source


def test_serve_refuses_the_unconverted_checkpoint_and_serves_the_converted_one(speculators_753, tmp_path, capsys):
    assert main([*SERVE, "--drafter", str(speculators_753)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dspark serve: error:")
    assert "shifted slots" in err and f"dspark convert --in {speculators_753} --out NEW_DIR" in err
    converted = tmp_path / "converted"
    assert main(["convert", "--in", str(speculators_753), "--out", str(converted)]) == 0
    out = capsys.readouterr().out
    assert f"{speculators_753}: speculators checkpoint (vllm-project/speculators; slot j predicts anchor + j" in out
    assert "converted; dspark drafter, gamma 5 (a block of 6 slots, slot j predicts anchor + j)" in out
    assert main([*SERVE, "--drafter", str(converted)]) == 0
    assert "--speculative-algorithm DSPARK" in capsys.readouterr().out


def test_check_names_the_convention_of_each(speculators_753, tmp_path, capsys):
    assert main(["check", str(speculators_753), "--target", str(EMBEDDED_TARGET)]) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith(f"{speculators_753}: speculators layout (vllm-project/speculators;")
    assert "dspark convert --in" in captured.err
    assert main(["check", str(EMBEDDED / "eagle3"), "--target", str(EMBEDDED_TARGET)]) == 0
    assert "SGLang Eagle3 layout (SGLang / SpecForge Eagle3" in capsys.readouterr().out


def test_convert_copies_a_served_checkpoint_and_refuses_to_overwrite(tmp_path, capsys):
    assert main(["convert", "--in", str(EMBEDDED / "dspark"), "--out", str(tmp_path / "out")]) == 0
    assert "copied unchanged: already served as trained" in capsys.readouterr().out
    assert main(["convert", "--in", str(EMBEDDED / "dflash"), "--out", str(tmp_path / "out")]) == 2
    assert f"--out {tmp_path / 'out'} exists and is not an empty directory" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "config.json").read_text())["markov_rank"] == 64  # dspark's, untouched
