"""rsd's loader for PyTorch trainers.

    import rsd
    loader = rsd.Loader("data/book", micro_batch=4, seed=0)      # rank and world from torchrun
    for batch in loader:
        logits = model(batch["input_ids"], position_ids=batch["position_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
        ...
    torch.save({"loader": loader.state_dict(), ...}, "ckpt.pt")  # resume: loader.load_state_dict(...)

The stream is rsd-loader's (the one `rsd-train` and `rsd-data stream` read): a deterministic
shuffle and mixture, sliced by data- and context-parallel rank, assembled ahead by Rust threads.
See docs/PYTHON.md for every argument and key.
"""
import json
import os

try:
    import torch
except ImportError as e:  # pragma: no cover - a trainer has torch
    raise ImportError("rsd.Loader hands out torch tensors: install torch first") from e

from . import _rsd
from ._rsd import LoaderError

__all__ = ["Loader", "LoaderError"]

# Keys whose NumPy arrays become tensors; the others are ints.
_TENSORS = frozenset(("input_ids", "labels", "position_ids", "loss_mask", "cu_seqlens",
                      "doc_offsets", "row_offsets", "full_row_offsets", "chunks", "samples"))


def _env_int(name):
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r}: expected an integer") from None


def _datasets(shards, mixture, pipeline, data_root):
    if pipeline is not None:
        if shards is not None or mixture is not None:
            raise ValueError("give shards (and mixture) or pipeline, not both")
        root = data_root or os.environ.get("RSD_DATA_ROOT", ".")
        return [(str(d), w) for d, w in _rsd.read_pipeline(str(pipeline), str(root))]
    if shards is None:
        raise ValueError("no shards given: a shard directory, a list of them, or pipeline=FILE")
    if isinstance(shards, (str, os.PathLike)):
        shards = [shards]
    shards = [os.fspath(s) for s in shards]
    if mixture is None:
        return [(s, 1.0) for s in shards]
    if isinstance(mixture, dict):
        unknown = sorted(set(map(os.fspath, mixture)) - set(shards))
        if unknown:
            raise ValueError(f"mixture names {unknown}, which are not among shards {shards}")
        missing = [s for s in shards if s not in {os.fspath(k) for k in mixture}]
        if missing:
            raise ValueError(f"mixture has no weight for {missing}")
        weights = {os.fspath(k): float(v) for k, v in mixture.items()}
        return [(s, weights[s]) for s in shards]
    mixture = [float(w) for w in mixture]
    if len(mixture) != len(shards):
        raise ValueError(f"{len(mixture)} mixture weights for {len(shards)} shard directories: "
                         "give one weight per directory")
    return list(zip(shards, mixture))


class Loader(torch.utils.data.IterableDataset):
    """One rank's stream of batches from rsd token shards, as dicts of torch tensors.

    Args:
        shards: a shard directory written by `rsd-data pack`, or a list of them.
        seq_len: the packing length you expect; checked against the shards' (None: theirs).
        micro_batch: rows per rank per step (the default, 1).
        token_budget: instead of micro_batch, as many rows as fit in this many tokens (mixed shards).
        seed: the shuffle seed; the same seed gives the same stream on every machine.
        dp_rank, dp_size, cp_rank, cp_size: this rank's place in the data- and context-parallel
            mesh. Unset, they come from torchrun's RANK and WORLD_SIZE: with cp_size P, ranks
            r..r+P-1 share rows (cp_rank = RANK % P, dp_rank = RANK // P, dp_size = WORLD_SIZE // P).
        mixture: weights, one per shard directory (a list), or {directory: weight}.
        pipeline: a pipelines/*.json file naming datasets and weights, instead of shards/mixture.
        epochs: stop when the first dataset finishes this many epochs (None: never).
        shuffle: False reads the samples in stored order.
        positions: "auto" (restart at each document in mixed shards), "row" or "document".
        workers: Rust threads assembling batches ahead (0: on the calling thread).
        prefetch: batches assembled ahead, at least.
        verify: check every shard's checksums when opening (reads all bytes once).
        int64: ids, labels and positions as int64 (what embeddings and cross_entropy take);
            False hands over the loader's int32 buffers themselves.
        meta: also the layout arrays and each row's origin (below); always with cp_size > 1.

    Each batch is a dict: input_ids, labels (-100: no loss), position_ids, shaped [rows, len]
    (len = seq_len / cp_size); loss_mask (bool, where the label counts) when a dataset carries
    an SFT loss mask; cu_seqlens (int32) and max_seqlen, the document pieces for
    flash_attn_varlen_func, without context parallelism; step, num_tokens, num_label_tokens.
    With meta (or context parallelism): doc_offsets, row_offsets, full_row_offsets, chunks
    (int32, as docs/LOADER.md defines them) and samples ([rows, 5] int64: dataset, shard, index
    in shard, global index, epoch).

    With DataLoader, pass batch_size=None and num_workers=0: batches are already made, and the
    prefetching runs in the loader's own threads. Worker processes would each replay the same
    stream, so iterating inside one raises an error.
    """

    def __init__(self, shards=None, seq_len=None, micro_batch=None, seed=0, dp_rank=None,
                 dp_size=None, cp_rank=None, cp_size=1, mixture=None, *, pipeline=None,
                 data_root=None, token_budget=None, epoch=0, epochs=None, shuffle=True,
                 positions="auto", mask_doc_boundaries=None, workers=2, prefetch=4, verify=False,
                 int64=True, meta=False):
        super().__init__()
        rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
        if cp_size < 1:
            raise ValueError(f"cp_size={cp_size}: expected at least 1")
        if world is not None and world % cp_size:
            raise ValueError(f"WORLD_SIZE={world} is not a multiple of cp_size={cp_size}")
        if cp_rank is None:
            cp_rank = rank % cp_size if rank is not None else 0
        if dp_rank is None:
            dp_rank = rank // cp_size if rank is not None else 0
        if dp_size is None:
            dp_size = world // cp_size if world is not None else 1
        self._args = dict(
            datasets=_datasets(shards, mixture, pipeline, data_root), batch_size=micro_batch,
            token_budget=token_budget, seed=seed, epoch=epoch, epochs=epochs, dp_rank=dp_rank,
            dp_size=dp_size, cp_rank=cp_rank, cp_size=cp_size, shuffle=shuffle,
            positions=positions, mask_doc_boundaries=mask_doc_boundaries, workers=workers,
            prefetch=prefetch, verify=verify, int64=int64, meta=meta)
        self._inner = _rsd.Loader(**self._args)
        if seq_len is not None and seq_len != self._inner.seq_len:
            raise ValueError(f"seq_len={seq_len}, but the shards are packed to "
                             f"{self._inner.seq_len} tokens per row")

    @property
    def seq_len(self):
        """The shards' packing length (tokens per row before context-parallel slicing)."""
        return self._inner.seq_len

    @property
    def dataset_sizes(self):
        """Samples in each dataset, in the order given."""
        return self._inner.dataset_sizes

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise RuntimeError(
                f"rsd.Loader in a DataLoader with num_workers={info.num_workers}: each worker "
                "would replay the same stream. Use num_workers=0 and batch_size=None; the loader "
                "prefetches in its own threads (workers=…)")
        return self

    def __next__(self):
        batch = self._inner.__next__()
        if batch is None:
            raise StopIteration
        # In place: a second dict a batch would be one more object for Python's cyclic GC, whose
        # collections are the largest part of this thread's cost at tens of thousands of batches/s.
        for k in _TENSORS.intersection(batch):
            batch[k] = torch.from_numpy(batch[k])
        return batch

    def state_dict(self):
        """Where the stream stands after the last batch returned: a small JSON-able dict."""
        return json.loads(self._inner.state_json())

    def load_state_dict(self, state):
        """Continue from `state_dict()`'s dict, exactly, also on another dp_size or micro_batch."""
        self._inner = _rsd.Loader(**self._args, state=json.dumps(state))
