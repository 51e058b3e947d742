"""The target's outputs on a training set, written once in bf16 to memory-mapped shards and read back by every
epoch (`dspark train --feature-cache DIR`).

Layout of a store (a directory named by the hash of its key: the dataset's key, the tapped layers, whether the
target ran under bf16 autocast): `manifest.json` (the key, samples, sequence length, the two feature widths, the
shard count), and for shard s of S: `shard-s.hidden.bf16` and `shard-s.last.bf16`, raw bf16 rows of
[seq, width] for samples [s·n/S, (s+1)·n/S), and `shard-s.progress.json` ({"rows": rows written}).

Writing: under torchrun every rank writes its own shard (rank r writes shard r of world_size) with its own copy
of the target, in parallel. A writer first prints the store's expected size, preallocates its files, and after
each batch of rows flushes them and then records the rows written; a writer started again on the same store
continues after the last recorded row. With a target sharded over the ranks (sharding.py) a forward is a
collective: a writer then runs as many forwards as the rank with the most left (`forwards`), the extra ones on one
token, discarded. Reading: each shard file is mapped with torch.from_file (no copy in RAM:
pages are read as batches touch them), so a store many times the RAM of a rank trains as well as a small one, and
a complete store is read by any number of ranks, whatever number wrote it.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from dspark.models.cache import key_digest
from dspark.models.errors import ConfigError
from dspark.models.target_features import capture_target_features
from dspark.models.training.data import TokenDataset
from dspark.models.training.feature_cache import feature_rows
from dspark.models.training.tasks import TargetOutputs

MANIFEST = "manifest.json"
BYTES = 2  # bf16
PARTS = ("hidden", "last")
MAX_SHARDS = 1 << 16  # one a rank


@dataclass(frozen=True)
class StoreLayout:
    samples: int
    seq_len: int
    hidden_width: int  # n_taps * hidden
    last_width: int  # hidden
    shards: int

    def rows(self, shard: int) -> range:
        return range(shard * self.samples // self.shards, (shard + 1) * self.samples // self.shards)

    def width(self, part: str) -> int:
        return self.hidden_width if part == "hidden" else self.last_width

    @property
    def bytes_per_sample(self) -> int:
        return self.seq_len * (self.hidden_width + self.last_width) * BYTES

    @property
    def total_bytes(self) -> int:
        return self.samples * self.bytes_per_sample


def store_directory(root: Path, key: dict) -> Path:
    return Path(root) / key_digest(key)


def _shard_file(directory: Path, shard: int, part: str) -> Path:
    return directory / f"shard-{shard:05d}.{part}.bf16"


def _progress_file(directory: Path, shard: int) -> Path:
    return directory / f"shard-{shard:05d}.progress.json"


def _read_json(path: Path, what: str):
    if not path.is_file():  # a FIFO would block the run, a directory cannot be read
        raise ConfigError(f"feature store {what} {path} is not a regular file: delete the store's directory to write "
                          "it again")
    try:
        with path.open("rb") as handle:  # a manifest is a few hundred bytes: more than 1 MiB is not one
            return json.loads(handle.read(1 << 20))
    except (ValueError, RecursionError, OSError) as error:  # JSONDecodeError and UnicodeDecodeError included
        raise ConfigError(f"feature store {what} {path} cannot be read ({str(error)[:120]}): delete the store's "
                          "directory to write it again") from None


def _rows_written(directory: Path, shard: int, layout: StoreLayout) -> int:
    path = _progress_file(directory, shard)
    if not path.exists():
        return 0
    progress = _read_json(path, "progress file")
    rows = progress.get("rows") if isinstance(progress, dict) else None
    if type(rows) is not int or not 0 <= rows <= len(layout.rows(shard)):
        raise ConfigError(f"feature store progress file {path} records rows={str(rows)[:40]}, not in "
                          f"[0, {len(layout.rows(shard))}]: delete the store's directory to write it again")
    return rows


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # every rank writes the manifest: a tmp file each
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _check_manifest(directory: Path, key: dict, layout: StoreLayout) -> None:
    """Write the manifest, or check that the one there describes this store (a rerun with other settings or
    another rank count must not append to it)."""
    manifest = {"key": json.loads(json.dumps(key)), "layout": asdict(layout)}
    path = directory / MANIFEST
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        _write_json(path, manifest)
        return
    found = _read_json(path, "manifest")
    if found != manifest:
        started = found.get("layout") if isinstance(found, dict) else found
        raise ConfigError(f"feature store {directory} was started with layout {str(started)[:300]}, this run needs "
                          f"{manifest['layout']}: rerun with as many ranks as wrote it, or delete the directory")


def describe_size(layout: StoreLayout, directory: Path) -> str:
    gib = 1024 ** 3
    return (f"feature store {directory}: {layout.samples} samples x {layout.seq_len} tokens x "
            f"{layout.hidden_width + layout.last_width} bf16 values = {layout.total_bytes / gib:.3f} GiB in "
            f"{layout.shards} shard(s) of about {layout.total_bytes / layout.shards / gib:.3f} GiB")


def forwards_left(directory: Path, layout: StoreLayout, shard: int, batch_size: int = 16) -> int:
    """The target forwards (batches of batch_size rows) shard `shard` still needs."""
    return -(-(len(layout.rows(shard)) - _rows_written(directory, shard, layout)) // batch_size)


def write_shard(directory: Path, key: dict, layout: StoreLayout, shard: int, target: torch.nn.Module,
                dataset: TokenDataset, layer_ids: tuple[int, ...], batch_size: int = 16,
                progress: bool = True, forwards: int = 0) -> None:
    """Write (or finish writing) shard `shard` of the store (module docstring); prints the expected size first.
    `forwards`: run the target at least this many times (a sharded target's forwards are collectives)."""
    if progress:
        print(describe_size(layout, directory), flush=True)
    _check_manifest(directory, key, layout)
    extra = forwards - forwards_left(directory, layout, shard, batch_size)
    rows, done = layout.rows(shard), _rows_written(directory, shard, layout)
    handles = {}
    for part in PARTS:
        path = _shard_file(directory, shard, part)
        try:  # never through a link: the file it points to would be truncated and overwritten
            handle = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644), "r+b")
        except OSError as err:
            raise ConfigError(f"feature store shard {path} cannot be written ({os.strerror(err.errno)}): it must be "
                              "a regular file; delete the store's directory to write it again") from None
        handle.truncate(len(rows) * layout.seq_len * layout.width(part) * BYTES)  # zeros where nothing is written
        handles[part] = handle
    todo = range(rows.start + done, rows.stop)
    bar = tqdm(total=len(rows), initial=done, desc=f"feature shard {shard}", unit="sample", disable=not progress)
    try:
        for batch, hidden, last in feature_rows(target, dataset, todo, layer_ids, batch_size):
            for part, values in zip(PARTS, (hidden, last)):
                handle = handles[part]
                handle.seek((batch.start - rows.start) * layout.seq_len * layout.width(part) * BYTES)
                handle.write(values.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
                handle.flush()
                os.fsync(handle.fileno())
            _write_json(_progress_file(directory, shard), {"rows": batch.stop - rows.start})
            bar.update(len(batch))
        one_token = dataset.input_ids[:1, :1].to(next(target.parameters()).device)
        with torch.no_grad():
            for _ in range(extra):  # in step with the ranks that have more rows left
                capture_target_features(target, one_token, layer_ids)
    finally:
        bar.close()
        for handle in handles.values():
            handle.close()


class StoredFeatures:
    """A complete store, memory-mapped; called like OnlineFeatures with the batch's sample ids."""

    def __init__(self, directory: Path, layout: StoreLayout, lm_head: torch.nn.Module) -> None:
        self.layout, self.lm_head = layout, lm_head
        self.starts = [layout.rows(s).start for s in range(layout.shards)]
        self.maps = []
        for shard in range(layout.shards):
            n = len(layout.rows(shard))
            self.maps.append({part: self._map(_shard_file(directory, shard, part), n, layout.width(part))
                              for part in PARTS})

    def _map(self, path: Path, rows: int, width: int) -> torch.Tensor:
        size = rows * self.layout.seq_len * width
        found = path.stat().st_size if path.is_file() else None
        if found is None or found < size * BYTES:
            raise ConfigError(f"feature store shard {path} holds {found} bytes, {size * BYTES} needed: delete the "
                              "store's directory to write it again")
        return torch.from_file(str(path), shared=False, size=size, dtype=torch.bfloat16).view(rows, -1, width)

    def sample(self, row: int, part: str) -> torch.Tensor:
        shard = max(s for s, start in enumerate(self.starts) if start <= row)
        return self.maps[shard][part][row - self.starts[shard]]

    def __call__(self, index: torch.Tensor, batch: TokenDataset) -> TargetOutputs:
        # index: [bs] long, rows of the dataset the batch holds
        device = batch.input_ids.device
        hidden, last = (torch.stack([self.sample(int(i), part) for i in index]).to(device=device, dtype=torch.float32)
                        for part in PARTS)
        return TargetOutputs(hidden=hidden, last_hidden=last, lm_head=self.lm_head)


def open_store(directory: Path, key: dict, expected: StoreLayout, lm_head: torch.nn.Module) -> StoredFeatures | None:
    """The store at `directory` if it holds exactly `key` in the `expected` layout (written by any number of
    shards) and every shard is complete, else None; a manifest that does not hold is refused by name."""
    path = Path(directory) / MANIFEST
    if not path.exists():
        return None
    manifest = _read_json(path, "manifest")
    if not isinstance(manifest, dict) or manifest.get("key") != json.loads(json.dumps(key)):
        return None
    found = manifest.get("layout")
    fields = asdict(expected)
    if (not isinstance(found, dict) or set(found) != set(fields)
            or any(type(found[name]) is not type(value) for name, value in fields.items())  # 4.0 is not 4
            or not 1 <= found["shards"] <= MAX_SHARDS
            or {**found, "shards": expected.shards} != fields):
        raise ConfigError(f"feature store manifest {path} holds layout {str(found)[:300]} for this run's key, which "
                          f"needs {fields} (any shard count): delete the store's directory to write it again")
    layout = StoreLayout(**found)
    if any(_rows_written(directory, s, layout) < len(layout.rows(s)) for s in range(layout.shards)):
        return None
    return StoredFeatures(Path(directory), layout, lm_head)
