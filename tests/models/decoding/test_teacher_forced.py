"""The target's greedy replies as a teacher-forcing dataset (models/evaluation/teacher_forced.py); the check itself
runs end to end in `dspark eval --teacher-forced` (tests/ops/commands/test_decoding_commands.py)."""
from dspark.models.decoding.engine import Generation
from dspark.models.evaluation.teacher_forced import replies_dataset


def test_a_replies_dataset_holds_prompt_and_reply_with_anchors_allowed_only_in_the_reply():
    replies = [Generation(prompt_ids=[5, 6, 7], token_ids=[8, 9]), Generation(prompt_ids=[1], token_ids=[2, 3, 4, 0])]
    dataset = replies_dataset(replies)
    assert dataset.input_ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 4, 0]]
    assert dataset.loss_mask.tolist() == [[False, False, False, True, True], [False, True, True, True, True]]
    assert dataset.attention_mask.tolist() == [[True] * 5, [True] * 5]
    short = replies_dataset([Generation(prompt_ids=[1, 2], token_ids=[3]), replies[0]])
    assert short.input_ids[0].tolist() == [1, 2, 3, 0, 0] and short.attention_mask[0].tolist() == [True] * 3 + [False] * 2
