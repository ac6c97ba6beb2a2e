"""The Python package (`import rsd`, built from python/ by maturin): its batches against
`rsd-data stream --full` (the Rust loader, same arguments) row by row — ids, labels, positions,
document boundaries, sample origins — for fixed and mixed shards, mixtures, DP and CP ranks; exact
resume mid-epoch and across a DP size change; the SFT loss mask; DataLoader; errors as Python
exceptions; and a tiny PyTorch model trained from it under `torchrun --nproc 2`.

scripts/setup.sh installs the package into the venv (`pip install ./python`)."""

import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import rsd
from rsd_cli import rsd as rsd_data

ROOT = Path(__file__).resolve().parents[1]
MINI_TOK = ROOT / "assets" / "tokenizers" / "mini-1k" / "tokenizer.json"


def stream(*dirs, **opts):
    """The Rust loader's rows (`rsd-data stream --full`), one dict per row."""
    args = ["stream", *map(str, dirs), "--full"]
    for k, v in opts.items():
        flag = "--" + k.replace("_", "-")
        args += [flag] if v is True else [flag, str(v)]
    return [json.loads(line) for line in rsd_data(*args).stdout.splitlines()]


def python_rows(loader, batches=None):
    """The Python loader's batches, split into rows shaped like `stream`'s."""
    out = []
    # islice stops before asking for one batch more, which would move the loader's state on
    for b in itertools.islice(loader, batches):
        ro = b["row_offsets"].tolist()
        flat = {k: b[k].flatten().tolist() for k in ("input_ids", "labels", "position_ids")}
        fro = b["full_row_offsets"].tolist()
        docs = b["doc_offsets"].tolist()
        per_row = len(b["chunks"]) // len(b["samples"])
        for r, s in enumerate(b["samples"].tolist()):
            base, end = fro[r], fro[r + 1]
            out.append({
                "step": b["step"], "row": r, "source": s[0], "shard": s[1], "index": s[2],
                "global": s[3], "epoch": s[4],
                "ids": flat["input_ids"][ro[r]:ro[r + 1]],
                "target": flat["labels"][ro[r]:ro[r + 1]],
                "position_ids": flat["position_ids"][ro[r]:ro[r + 1]],
                "docs": [d - base for d in docs if base < d <= end],
                "chunks": [[c - base for c in ch] for ch in b["chunks"][r * per_row:(r + 1) * per_row].tolist()],
            })
    return out


def Loader(*args, **kwargs):
    """rsd.Loader with each batch's layout arrays and row origins (meta=True): what the row
    comparisons read."""
    return rsd.Loader(*args, meta=True, **kwargs)


KEYS = ("step", "row", "source", "shard", "index", "global", "epoch", "ids", "target",
        "position_ids", "docs", "chunks")


def assert_same_rows(py, rust):
    assert len(py) == len(rust) > 0
    for i, (a, b) in enumerate(zip(py, rust)):
        for k in KEYS:
            assert a[k] == b[k], f"row {i}: {k} differs: python {a[k][:12] if isinstance(a[k], list) else a[k]} " \
                                 f"vs rsd-data stream {b[k][:12] if isinstance(b[k], list) else b[k]}"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The bundled corpus packed small: books fixed 128, books mixed 256, code mixed 256."""
    tmp = tmp_path_factory.mktemp("pyloader")
    out = {}
    for name, src, length, mode in [("books", "books", 128, "fixed"),
                                    ("books_mixed", "books", 256, "mixed"),
                                    ("code_mixed", "code", 256, "mixed")]:
        d = tmp / name
        rsd_data("pack", "--len", length, "--mode", mode, "--src", ROOT / "corpus" / src,
                 "--tokenizer", MINI_TOK, "--out", d, "--shard-size", "128KiB", "--progress", "none")
        out[name] = d
    return out


@pytest.mark.parametrize("case", [
    dict(name="books", opts=dict(seed=5, batch_size=3)),
    dict(name="books_mixed", opts=dict(seed=2, batch_size=2)),
    dict(name="books_mixed", opts=dict(seed=2, batch_size=2, positions="row", no_shuffle=True)),
    dict(name="books", opts=dict(seed=1, batch_size=2, dp_rank=1, dp_size=3)),
    dict(name="books_mixed", opts=dict(seed=4, batch_size=1, cp_rank=1, cp_size=2, dp_rank=0, dp_size=2)),
    dict(name="code_mixed", opts=dict(seed=9, token_budget=600)),
])
def test_rows_equal_the_rust_loaders(data, case):
    opts = dict(case["opts"])
    rust = stream(data[case["name"]], batches=25, **opts)
    kw = dict(seed=opts["seed"], dp_rank=opts.get("dp_rank", 0), dp_size=opts.get("dp_size", 1),
              cp_rank=opts.get("cp_rank", 0), cp_size=opts.get("cp_size", 1),
              positions=opts.get("positions", "auto"), shuffle=not opts.get("no_shuffle", False))
    if "token_budget" in opts:
        kw["token_budget"] = opts["token_budget"]
    else:
        kw["micro_batch"] = opts["batch_size"]
    py = python_rows(Loader(data[case["name"]], **kw), batches=25)
    assert_same_rows(py, rust)


def test_batch_tensors(data):
    loader = rsd.Loader(data["books_mixed"], seq_len=256, micro_batch=4, seed=0)
    b = next(iter(loader))
    # the layout arrays and row origins come with meta=True (or context parallelism) only
    assert not {"samples", "chunks", "row_offsets", "doc_offsets"} & set(b)
    assert {"samples", "chunks", "row_offsets", "doc_offsets", "full_row_offsets"} <= set(
        next(iter(rsd.Loader(data["books_mixed"], micro_batch=4, seed=0, meta=True))))
    assert "chunks" in next(iter(rsd.Loader(data["books_mixed"], micro_batch=1, seed=0, cp_size=2)))
    assert b["input_ids"].shape == b["labels"].shape == b["position_ids"].shape == (4, 256)
    assert b["input_ids"].dtype == b["labels"].dtype == torch.int64
    # labels are the next ids, except where a document ends (no label across a boundary)
    ids, labels = b["input_ids"], b["labels"]
    kept = labels[:, :-1] != -100
    assert torch.equal(labels[:, :-1][kept], ids[:, 1:][kept])
    assert (labels[:, -1] == -100).all()
    # cu_seqlens: document pieces over the flattened batch, every row start among them
    cu = b["cu_seqlens"].tolist()
    assert cu[0] == 0 and cu[-1] == 4 * 256 and cu == sorted(cu)
    assert {0, 256, 512, 768} <= set(cu)
    assert b["max_seqlen"] == max(np.diff(cu))
    # positions restart at each document piece (mixed shards)
    flat_pos = b["position_ids"].flatten()
    for a, e in zip(cu[:-1], cu[1:]):
        assert flat_pos[a:e].tolist() == list(range(e - a))
    assert b["num_label_tokens"] == int((labels != -100).sum())
    # int64=False hands over the loader's own int32 buffers
    b32 = next(iter(rsd.Loader(data["books_mixed"], micro_batch=4, seed=0, int64=False)))
    assert b32["input_ids"].dtype == torch.int32 and torch.equal(b32["input_ids"].long(), ids)


@pytest.mark.parametrize("int64", [False, True])
def test_buffers_come_back_only_when_python_lets_go(data, int64):
    """A batch's arrays are the loader's buffers, reused once Python frees them: batches still
    held keep their values while later batches are made, a batch edited in place and freed does
    not leak into later ones, and freed memory is in fact reused."""
    rust = stream(data["books_mixed"], seed=3, batch_size=2, batches=1800)
    want = [label for r in rust for label in r["target"]]
    loader = iter(rsd.Loader(data["books_mixed"], micro_batch=2, seed=3, workers=2, int64=int64))
    held, seen, addresses, reused = [], [], set(), 0
    # Small batches get a deep prefetch window (8 MiB): reuse starts after ~1,400 of these.
    for step in range(1800):
        b = next(loader)
        ptr = b["labels"].data_ptr()
        reused += ptr in addresses
        addresses.add(ptr)
        seen += b["labels"].flatten().tolist()
        if step % 300 == 0:
            held.append((step, b["labels"].clone(), b["labels"]))  # kept alive
        else:
            b["labels"].fill_(7)  # edited in place, then freed with the batch
        del b
    assert seen == want
    for step, copy, tensor in held:
        assert torch.equal(tensor, copy), f"batch {step} changed while Python still held it"
    assert reused > 0, "no freed buffer was reused"


def test_mixture_weights_and_dict(data):
    a, b = data["books_mixed"], data["code_mixed"]
    rust = stream(a, b, weights="3,1", seed=1, batch_size=2, batches=40)
    py = python_rows(Loader([a, b], mixture=[3, 1], seed=1, micro_batch=2), batches=40)
    assert_same_rows(py, rust)
    py_dict = python_rows(Loader([a, b], mixture={str(b): 1, str(a): 3}, seed=1, micro_batch=2), batches=40)
    assert_same_rows(py_dict, rust)
    sources = [r["source"] for r in py]
    assert 0.6 < sources.count(0) / len(sources) < 0.9


def test_resume_mid_epoch_is_exact(data):
    d = data["books"]
    whole = python_rows(Loader(d, micro_batch=2, seed=3), batches=30)
    first = Loader(d, micro_batch=2, seed=3)
    head = python_rows(first, batches=11)
    state = json.loads(json.dumps(first.state_dict()))  # through JSON, as a checkpoint would
    again = Loader(d, micro_batch=2, seed=3)
    again.load_state_dict(state)
    tail = python_rows(again, batches=19)
    assert [r["global"] for r in head + tail] == [r["global"] for r in whole]
    assert [r["ids"] for r in head + tail] == [r["ids"] for r in whole]


def test_resume_on_another_dp_size(data, tmp_path):
    """A state saved by two DP ranks, resumed by one: the rows the Rust loader streams from it."""
    d = data["books"]
    ranks = [Loader(d, micro_batch=2, seed=8, dp_rank=r, dp_size=2) for r in range(2)]
    for loader in ranks:
        python_rows(loader, batches=7)
    states = [loader.state_dict() for loader in ranks]
    assert states[0] == states[1]
    (tmp_path / "state.json").write_text(json.dumps(states[0]))
    rust = stream(d, seed=8, batch_size=4, resume=tmp_path / "state.json", batches=10)
    one = Loader(d, micro_batch=4, seed=8, dp_size=1)
    one.load_state_dict(states[0])
    assert_same_rows(python_rows(one, batches=10), rust)
    # and nothing the two ranks read comes again
    seen = {r["global"] for loader in [Loader(d, micro_batch=2, seed=8, dp_rank=k, dp_size=2) for k in range(2)]
            for r in python_rows(loader, batches=7)}
    assert not seen & {r["global"] for r in rust}


def test_sft_loss_mask(data, tmp_path):
    out = tmp_path / "chat"
    rsd_data("pack", "--chat", "--src", ROOT / "corpus" / "chat" / "train.jsonl", "--len", 1024,
             "--out", out, "--progress", "none")
    rust = stream(out, seed=0, batch_size=2, batches=6)
    loader = Loader(out, micro_batch=2, seed=0)
    rows = python_rows(Loader(out, micro_batch=2, seed=0), batches=6)
    assert_same_rows(rows, rust)
    b = next(iter(loader))
    assert torch.equal(b["loss_mask"], b["labels"] != -100)
    # assistant turns only: far fewer labels than tokens
    assert 0 < b["loss_mask"].sum() < 0.7 * b["input_ids"].numel()
    # shards without a mask get no loss_mask key
    assert "loss_mask" not in next(iter(Loader(data["books"], micro_batch=1)))


def test_dataloader_and_workers(data):
    d = data["books"]
    direct = python_rows(Loader(d, micro_batch=2, seed=4), batches=5)
    dl = torch.utils.data.DataLoader(Loader(d, micro_batch=2, seed=4), batch_size=None, num_workers=0)
    via = python_rows(dl, batches=5)
    assert [r["ids"] for r in via] == [r["ids"] for r in direct]
    bad = torch.utils.data.DataLoader(Loader(d, micro_batch=2, seed=4), batch_size=None, num_workers=2)
    with pytest.raises(Exception, match="num_workers=2"):
        next(iter(bad))


def test_torchrun_variables_set_the_ranks(data, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    d = data["books"]
    rows = python_rows(Loader(d, micro_batch=1, seed=2, cp_size=2), batches=4)
    rust = stream(d, seed=2, dp_rank=1, dp_size=2, cp_rank=1, cp_size=2, batches=4)
    assert_same_rows(rows, rust)
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="WORLD_SIZE=3 is not a multiple of cp_size=2"):
        Loader(d, cp_size=2)


def test_errors_are_python_exceptions(data, tmp_path):
    with pytest.raises(rsd.LoaderError, match=str(tmp_path / "nope")):
        rsd.Loader(tmp_path / "nope")
    with pytest.raises(ValueError, match="2 mixture weights for 1 shard directories"):
        Loader(data["books"], mixture=[1, 2])
    with pytest.raises(ValueError, match="seq_len=4096, but the shards are packed to 128"):
        Loader(data["books"], seq_len=4096)
    with pytest.raises(ValueError, match="positions"):
        Loader(data["books"], positions="zigzag")
    with pytest.raises(rsd.LoaderError, match="dp_rank|rank"):
        Loader(data["books"], dp_rank=2, dp_size=2)
    loader = Loader(data["books"], seed=1)
    with pytest.raises(ValueError, match="loader state"):
        loader.load_state_dict({"version": 1, "seed": "x"})
    other = Loader(data["books"], seed=2)
    with pytest.raises(rsd.LoaderError, match="seed"):
        other.load_state_dict(loader.state_dict())
    # a shard whose bytes were damaged after packing: verify names it
    bad = tmp_path / "damaged"
    rsd_data("pack", "--len", 128, "--src", ROOT / "corpus" / "books", "--tokenizer", MINI_TOK,
             "--out", bad, "--progress", "none")
    binary = next(bad.glob("*.bin"))
    raw = bytearray(binary.read_bytes())
    raw[100] ^= 0xFF
    binary.write_bytes(bytes(raw))
    with pytest.raises(rsd.LoaderError, match=binary.name):
        Loader(bad, verify=True)


TRAIN = r'''
import os, sys, json, torch, torch.nn.functional as F
import torch.distributed as dist
import rsd
dist.init_process_group("gloo")
torch.manual_seed(0)
shards, out = sys.argv[1], sys.argv[2]
loader = rsd.Loader(shards, micro_batch=2, seed=0, meta=True)
model = torch.nn.Sequential(torch.nn.Embedding(1024, 32), torch.nn.Linear(32, 1024))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
losses, seen = [], []
for step, batch in enumerate(loader):
    if step == 40:
        break
    logits = ddp(batch["input_ids"])
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item()); seen += batch["samples"][:, 3].tolist()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
json.dump({"losses": losses, "seen": seen, "state": loader.state_dict(), "param_sum": flat.double().sum().item()},
          open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w"))
# Both ranks leave together, DDP's reducer goes before the group it uses, and the interpreter's
# own teardown (C++ static destructors of torch's Gloo backend) is skipped: it was seen to abort
# now and then ("terminate called without an active exception") after both ranks had written
# their files, which is torch's exit, not what this test checks.
dist.barrier()
del ddp, opt
dist.destroy_process_group()
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
'''


def test_trains_under_torchrun(data, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-addr", "127.0.0.1", "--master-port", str(port), str(script),
                        str(data["books"]), str(tmp_path)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # each rank read its own rows: those `rsd-data stream` gives that rank, none shared
    for r, res in enumerate(ranks):
        rust = stream(data["books"], seed=0, batch_size=2, dp_rank=r, dp_size=2, batches=40)
        assert res["seen"] == [row["global"] for row in rust]
    assert not set(ranks[0]["seen"]) & set(ranks[1]["seen"])
    assert ranks[0]["state"] == ranks[1]["state"]
    # DDP kept the replicas equal, and the model learned (first 5 vs last 5 steps)
    assert ranks[0]["param_sum"] == pytest.approx(ranks[1]["param_sum"], rel=1e-6)
    for res in ranks:
        assert np.mean(res["losses"][-5:]) < np.mean(res["losses"][:5]) - 0.5
