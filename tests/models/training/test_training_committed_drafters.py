"""The committed embedded drafters load against the committed target and carry their card and train log."""
import json

import pytest
from transformers import AutoConfig

from dspark.models.checkpoint import load_drafter
from tests.paths import EMBEDDED, EMBEDDED_TARGET

KINDS = ("dspark", "dflash", "eagle3")


@pytest.mark.parametrize("kind", KINDS)
def test_committed_drafter_fits_the_embedded_target(kind):
    directory = EMBEDDED / kind
    drafter = load_drafter(directory, AutoConfig.from_pretrained(str(EMBEDDED_TARGET)))
    assert drafter.config.kind == kind and drafter.config.target_layer_ids == (0, 1, 2)
    log = json.loads((directory / "train_log.json").read_text())
    card = (directory / "README.md").read_text()
    assert f"{log['steps']} optimizer steps" in card and "dspark train --target embedded/target" in card
    assert log["history"][-1]["loss"] < log["history"][0]["loss"], "training reduced the loss"


def test_committed_drafters_share_data_and_steps():
    jobs = [json.loads((EMBEDDED / kind / "train_log.json").read_text()) for kind in KINDS]
    assert len({job["steps"] for job in jobs}) == 1
    assert len({json.dumps(job["job"]["data_summary"]) for job in jobs}) == 1
    assert len({job["job"]["target_sha256"] for job in jobs}) == 1
