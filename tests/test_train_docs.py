"""Document masking (ProLong's recipe) and the KL's rows, against an independent PyTorch reference.

ProLong (princeton-nlp/ProLong, training/dataset.py and training/modeling_flash_llama.py) turns the
`indices` of each packed sample into separate sequences (`seq_lengths`, variable-length flash
attention: no attention across documents), labels the first token of every document −100, and
applies RoPE along the packed sequence (row positions; RoPE is relative, so within a document they
equal per-document positions up to a constant). The reference below runs every document as its own
sequence on transformers' model, with row positions, and writes the RSD loss out per document:

    CLM  = mean over (token, next token) pairs inside one document of −log p_std
    KL_b = (1/|R_b|) Σ_{i∈R_b} KL(p_pert(·|x_≤i) ‖ sg(p_std(·|x_≤i)))   (or 1/L_b: kl_norm = length)
    R_b  = rows i whose offset δ = r − p is not constant from i's document start to i
    loss = CLM + λ · mean_b KL_b

Padding after a row's real tokens (`--real-len`, the pack's `--tail pad`) is outside everything.
A training run on fixed shards packed from ProLong-layout MDS (written by mosaicml-streaming)
shows document masking on by default and off with `doc_mask = false`.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug).
"""
import json
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rsd_cli import run

B, L, V = 2, 24, 89
rsd_train = partial(run, "rsd-train")


def make_llama(path, vocab=V, hidden=48, layers=2, scale=4.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=80, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
                      tie_word_embeddings=False, max_position_embeddings=512)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger weights: the views really differ
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    m.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("train_docs")
    tokens = np.random.default_rng(1).integers(0, V, size=(B, L), dtype=np.int64)
    np.save(d / "tokens.npy", tokens)
    return d, tokens, make_llama(d / "llama")


def offsets(perturb, params, r, n):
    i = torch.arange(n)
    if perturb == "skip":
        s, y = params["split"][r], params["skip"][r]
        return torch.where(i >= s, y, 0)
    if perturb == "cyclic":
        return (i + params["shift"][r]) % n - i
    return torch.zeros(n, dtype=torch.long)


def reference(model_dir, tokens, docs, real, objective, perturb, params, kl_norm="rows", dtype=torch.float64):
    """Every document its own sequence (ProLong), full logits, autograd."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation="eager")
    ids = torch.from_numpy(tokens)

    def logits(x, pos):
        return m(input_ids=x[None], position_ids=pos[None], attention_mask=torch.ones(1, len(x), dtype=torch.long)).logits[0].to(dtype)

    ce, labels, kl = torch.zeros((), dtype=dtype), 0, torch.zeros((), dtype=dtype)
    for r in range(ids.shape[0]):
        n = real[r]
        bounds = [x for x in docs[r] if x < n] + [n]
        delta = offsets(perturb, params, r, n)
        row_pos = torch.arange(n)  # ProLong: positions along the packed row
        kl_sum, kl_rows = torch.zeros((), dtype=dtype), 0
        for a, e in zip(bounds, bounds[1:]):
            x = ids[r, a:e]
            ls = logits(x, row_pos[a:e])
            ce = ce + F.cross_entropy(ls[:-1], x[1:], reduction="sum")
            labels += e - a - 1
            if objective == "rsd":
                d = delta[a:e]
                differs = torch.cumsum((d != d[0]).long(), 0) > 0
                if differs.any():
                    lp = F.log_softmax(logits(x, row_pos[a:e] + d), -1)
                    lq = F.log_softmax(ls.detach(), -1)
                    k = (lp.exp() * (lp - lq)).sum(-1)
                    kl_sum = kl_sum + k[differs].sum()
                    kl_rows += int(differs.sum())
        if kl_rows:
            kl = kl + kl_sum / (kl_rows if kl_norm == "rows" else n)
    clm = ce / labels
    kl = kl / ids.shape[0]
    loss = clm + kl
    loss.backward()
    gn = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in m.parameters() if p.grad is not None))
    return dict(clm=clm.item(), kl=kl.item(), loss=loss.item(), grad_norm=gn.item())


def probe(model_dir, tok, objective, perturb, params, *extra):
    a = ["probe", "--model", model_dir, "--tokens", tok, "--objective", objective, "--perturb", perturb,
         "--dtype", "fp64", "--loss-chunk", 7, *extra]
    for k, v in params.items():
        a += [f"--{k}", ",".join(map(str, v))]
    return json.loads(rsd_train(*a).stdout)


def spec(docs):
    return ";".join(",".join(map(str, d)) for d in docs)


def assert_close(got, want, keys=("clm", "kl", "loss", "grad_norm"), rel=1e-6):
    for k in keys:
        assert got[k] == pytest.approx(want[k], rel=rel, abs=1e-10), (k, got[k], want[k])


DOCS = [[0, 7, 15, 24], [0, 10, 24]]
CASES = [
    ("standard", "skip", {"split": [0, 0], "skip": [1, 1]}),
    ("rsd", "skip", {"split": [9, 4], "skip": [5, 300]}),  # row 0: split inside its 2nd document
    ("rsd", "skip", {"split": [7, 10], "skip": [5, 30]}),  # splits at document starts: block shifts
    ("rsd", "cyclic", {"shift": [5, 11]}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2].get('split', c[2].get('shift'))}")
def test_documents_match_per_document_sequences(setup, case):
    d, tokens, model = setup
    objective, perturb, params = case
    got = probe(model, d / "tokens.npy", objective, perturb, params, "--docs", spec(DOCS), "--mask-doc-starts")
    want = reference(model, tokens, DOCS, [L, L], objective, perturb, params)
    assert_close(got, want)
    if params.get("split") == [7, 10]:
        # Every document after the split is shifted as a block: no KL row, no perturbed pass.
        assert got["kl"] == 0 and [r["kl_rows"] for r in got["rows"]] == [0, 0]
        assert got["perturbed_tokens"] == 0


def test_kl_normaliser_length_is_one_over_l(setup):
    d, tokens, model = setup
    params = {"shift": [5, 11]}
    rows = probe(model, d / "tokens.npy", "rsd", "cyclic", params)
    length = probe(model, d / "tokens.npy", "rsd", "cyclic", params, "--kl-norm", "length")
    assert_close(length, reference(model, tokens, [[0, L]] * B, [L, L], "rsd", "cyclic", params, kl_norm="length"))
    # Cyclic by u: u rows carry the KL; 1/u (default, the paper's reading) vs 1/L.
    assert [r["kl_rows"] for r in rows["rows"]] == [5, 11]
    per_row_ratio = length["kl"] / rows["kl"]
    assert 5 / L < per_row_ratio < 11 / L


def test_padding_is_outside_the_kl(setup):
    """KL over a padded batch equals the KL over the unpadded rows (each probed alone)."""
    d, tokens, model = setup
    real = [17, L]
    docs = [[0, 7, 15, 17, L], [0, 10, L]]  # the pack's tail padding is its own last document
    params = {"shift": [5, 11]}
    padded = tokens.copy()
    padded[0, 17:] = 0
    np.save(d / "padded.npy", padded)
    got = probe(model, d / "padded.npy", "rsd", "cyclic", params, "--docs", spec(docs), "--mask-doc-starts",
                "--real-len", "17,24")
    assert_close(got, reference(model, padded, docs, real, "rsd", "cyclic", params))
    alone = []
    for r, n in enumerate(real):
        np.save(d / f"row{r}.npy", padded[r:r + 1, :n])
        row_docs = [x for x in docs[r] if x < n] + [n]
        alone.append(probe(model, d / f"row{r}.npy", "rsd", "cyclic", {"shift": [params["shift"][r]]},
                           "--docs", spec([row_docs]), "--mask-doc-starts"))
    assert got["kl"] == pytest.approx(sum(a["kl"] for a in alone) / 2, rel=1e-9)
    assert [r["kl_rows"] for r in got["rows"]] == [a["rows"][0]["kl_rows"] for a in alone]
    # Without the padding marked, the KL differs (pad rows would enter it).
    unmarked = probe(model, d / "padded.npy", "rsd", "cyclic", params, "--docs", spec(docs), "--mask-doc-starts")
    assert unmarked["kl"] != pytest.approx(got["kl"], rel=1e-6)


@pytest.mark.parametrize("reuse", [True, False])
def test_rows_without_kl_rows_get_no_perturbed_pass(setup, reuse):
    d, tokens, model = setup
    # Row 0: skip at s = 0 shifts the whole row, nothing changes; row 1: split at 9.
    params = {"split": [0, 9], "skip": [5, 5]}
    extra = [] if reuse else ["--no-prefix-reuse"]
    got = probe(model, d / "tokens.npy", "rsd", "skip", params, *extra)
    assert [r["kl_rows"] for r in got["rows"]] == [0, L - 9]
    assert got["perturbed_tokens"] == (L - 9 if reuse else L)
    assert_close(got, reference(model, tokens, [[0, L]] * B, [L, L], "rsd", "skip", params))
    # PoSE trains on the perturbed view itself (one full pass, no standard view): every row runs.
    pose = probe(model, d / "tokens.npy", "pose", "skip", params, *extra)
    assert pose["perturbed_tokens"] == 2 * L


# --- training on fixed shards packed from ProLong-layout MDS

SEQ, PROLONG_VOCAB = 64, 128256


def write_prolong_mds(root, samples):
    """ProLong's layout (book-65536/procNN-64), `input_ids` + `indices`, by mosaicml-streaming."""
    from streaming import MDSWriter

    rng = np.random.default_rng(3)
    columns = {"input_ids": "ndarray:uint32", "indices": "ndarray:uint32", "domain": "str", "length": "int"}
    written = []
    d = root / "prolong-data-64K" / "book-65536" / "proc00-64"
    with MDSWriter(out=str(d), columns=columns) as w:
        for k in range(samples):
            cuts = np.sort(rng.choice(np.arange(2, SEQ - 1), size=2 + k % 2, replace=False))
            bounds = np.concatenate([[0], cuts, [SEQ]])
            ids = rng.integers(0, 1000, size=SEQ, dtype=np.uint32)
            indices = np.stack([bounds[:-1], bounds[1:]], axis=1).astype(np.uint32)
            w.write({"input_ids": ids, "indices": indices, "domain": "book", "length": SEQ})
            written.append((ids.astype(np.int64), [int(x) for x in bounds]))
    return written


def first_step_clm(model_dir, samples, doc_mask):
    """The CLM of the batch holding every sample, before any update (fp32)."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    ce, n = 0.0, 0
    with torch.no_grad():
        for ids, bounds in samples:
            spans = zip(bounds, bounds[1:]) if doc_mask else [(0, SEQ)]
            for a, e in spans:
                x = torch.from_numpy(ids[a:e])
                lg = m(input_ids=x[None], position_ids=torch.arange(a, e)[None]).logits[0]
                ce += F.cross_entropy(lg[:-1].double(), x[1:], reduction="sum").item()
                n += e - a - 1
    return ce / n, n


def test_fixed_shards_from_prolong_mds_train_document_masked_by_default(tmp_path):
    samples = write_prolong_mds(tmp_path / "root", 4)
    shards = tmp_path / "shards"
    run("rsd-data", "pack", "--len", SEQ, "--src", "prolong/book", "--data-root", tmp_path / "root",
        "--out", shards, "--progress", "none")
    assert json.loads((shards / "index.json").read_text())["mode"] == "fixed"
    model = make_llama(tmp_path / "llama", vocab=PROLONG_VOCAB, hidden=16, layers=1, scale=6.0)
    logged = {}
    for name, extra in [("default", []), ("on", ["--doc-mask", "true"]), ("off", ["--doc-mask", "false"])]:
        out = tmp_path / name
        rsd_train("--shards", shards, "--model", model, "--out", out, "--steps", 1, "--objective", "standard",
                  "--micro-batch", 4, "--progress", "false", "--threads", 2, "--allow-tokenizer-mismatch", *extra)
        m = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
        logged[name] = m[0]["clm"]
        cfg = (out / "checkpoints").glob("*/config.toml")
        assert any(f"doc_mask = {'false' if name == 'off' else 'true'}" in c.read_text() for c in cfg)
    masked, n_masked = first_step_clm(model, samples, True)
    plain, n_plain = first_step_clm(model, samples, False)
    assert n_plain - n_masked == sum(len(b) - 2 for _, b in samples)  # one label less per boundary
    assert logged["default"] == logged["on"]
    assert logged["default"] == pytest.approx(masked, rel=1e-5)
    assert logged["off"] == pytest.approx(plain, rel=1e-5)
    assert abs(masked - plain) > 2e-4 * abs(plain)  # 20× the tolerance: the two are told apart
