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


class StandInBlockDrafter(torch.nn.Module):
    """TEMPORARY stand-in with DSpark/DFlash's forward_train signature until models/drafters lands."""

    def __init__(self, n_taps: int, hidden: int, vocab: int, gamma: int, confidence: bool) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(n_taps * hidden, hidden)
        self.emb = torch.nn.Embedding(vocab, hidden)
        self.slot = torch.nn.Parameter(torch.zeros(gamma, hidden))
        self.head = torch.nn.Linear(hidden, vocab)
        self.conf = torch.nn.Linear(hidden, 1) if confidence else None

    def forward_train(self, target_hidden, input_ids, anchors, block_keep):
        from types import SimpleNamespace

        ctx = torch.gather(target_hidden, 1, (anchors - 1).clamp(min=0)[..., None].expand(-1, -1, target_hidden.shape[-1]))
        h = torch.tanh((self.fc(ctx) + self.emb(torch.gather(input_ids, 1, anchors)))[:, :, None] + self.slot)
        conf = None if self.conf is None else self.conf(h).squeeze(-1)
        return SimpleNamespace(draft_logits=self.head(h), confidence_logits=conf)


class StandInEagle3(torch.nn.Module):
    """TEMPORARY stand-in with Eagle3's forward_train signature until models/drafters lands."""

    def __init__(self, n_taps: int, hidden: int, vocab: int, steps: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(n_taps * hidden, hidden)
        self.emb = torch.nn.Embedding(vocab, hidden)
        self.step = torch.nn.Parameter(torch.zeros(steps, hidden))
        self.head = torch.nn.Linear(hidden, vocab)

    def forward_train(self, target_hidden, input_ids, attention_mask, ttt_steps):
        h = self.fc(target_hidden) + self.emb(torch.roll(input_ids, -1, dims=1))
        return torch.stack([self.head(torch.tanh(h + self.step[k])) for k in range(ttt_steps)])


def make_drafter_and_task(kind: str, target, gamma: int = 4, layer_ids=(0, 1, 2), n_anchors: int = 6):
    """A small drafter of `kind` for `target` and its training task."""
    from dspark.models.training.losses import DFLASH_LOSS, DSPARK_LOSS
    from dspark.models.training.tasks import BlockTask, Eagle3Task

    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    torch.manual_seed(1)
    if kind == "eagle3":
        return StandInEagle3(len(layer_ids), hidden, vocab, gamma), Eagle3Task(tuple(layer_ids), gamma)
    drafter = StandInBlockDrafter(len(layer_ids), hidden, vocab, gamma, confidence=kind == "dspark")
    weights = DSPARK_LOSS if kind == "dspark" else DFLASH_LOSS
    return drafter, BlockTask(tuple(layer_ids), gamma, n_anchors, weights)


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
