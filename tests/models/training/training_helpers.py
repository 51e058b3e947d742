"""Tiny random targets and stand-ins shared by the training tests (never the committed embedded weights)."""
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

TINY_VOCAB = 64
EOS_ID = 0
MASK_ID = 1


def build_tiny_target(seed: int = 0, layers: int = 4, hidden: int = 32, sharpness: float = 8.0) -> Qwen3ForCausalLM:
    """A random tiny Qwen3 whose (tied) embeddings are scaled by `sharpness`: its next-token distributions are
    then peaked (entropy ~2 nats at 8) like a trained LM's, so a drafter has something to learn."""
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=TINY_VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=2 * hidden,
        tie_word_embeddings=True,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
    )
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(sharpness)
    return model


def make_drafter_and_task(kind: str, target, gamma: int = 4, layer_ids=(0, 1, 2), n_anchors: int = 6):
    """A small real drafter of `kind` (1 layer, Markov rank 8 for DSpark) for `target` and its training task."""
    from dspark.models.drafters import DRAFTER_CLASSES, DrafterConfig
    from dspark.models.training.losses import DFLASH_LOSS, DSPARK_LOSS
    from dspark.models.training.tasks import BlockTask, Eagle3Task

    heads = {}
    if kind == "dspark":
        heads = dict(markov_rank=8, enable_confidence_head=True, confidence_head_with_markov=True)
    mask = None if kind == "eagle3" else MASK_ID
    config = DrafterConfig.from_target(target.config, kind=kind, block_size=gamma, target_layer_ids=layer_ids,
                                       num_hidden_layers=1, mask_token_id=mask, **heads)
    torch.manual_seed(1)
    drafter = DRAFTER_CLASSES[kind].from_target(target, config)
    if kind == "eagle3":
        return drafter, Eagle3Task(tuple(layer_ids), gamma)
    return drafter, BlockTask(tuple(layer_ids), gamma, n_anchors, DSPARK_LOSS if kind == "dspark" else DFLASH_LOSS)


def ddp_worker(rank: int, world_size: int, rendezvous: str, out_file: str, steps: int, batch_size: int) -> None:
    """One rank of a CPU/gloo data-parallel Eagle3 run (torch.multiprocessing.spawn target)."""
    import torch.distributed as dist

    from dspark.models.training.trainer import DistContext, TrainConfig, Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size)
    try:
        target, dataset = ddp_setup()
        drafter, task = make_drafter_and_task("eagle3", target)
        cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=5e-3)
        ctx = DistContext(rank=rank, world_size=world_size)
        trainer = Trainer(drafter, target, dataset, task, cfg, out_file + ".d", ctx, progress=False)
        trainer.run()
        if rank == 0:
            torch.save({"state": drafter.state_dict(), "history": trainer.history}, out_file)
    finally:
        dist.destroy_process_group()


def ddp_setup():
    """The target and dataset every rank of the data-parallel test builds identically."""
    from dspark.models.training.data import DataConfig, build_dataset

    target = build_tiny_target()
    g = torch.Generator().manual_seed(0)
    documents = [torch.randint(2, TINY_VOCAB, (n,), generator=g) for n in (40, 90, 60)]
    cfg = DataConfig(num_samples=8, prompt_len=6, response_len=10, generation_batch_size=8)
    return target, build_dataset(documents, cfg, target, EOS_ID, progress=False)

