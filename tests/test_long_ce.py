"""LongCE with sliding short-context windows: rsd-train against an independent PyTorch version.

LongCE's training code (LongPPL repository, `finetune/finetune.py`, `loss_weight`) computes, for a
sequence x_0 … x_{L−1} with reference length R (`trunc_len`, 4096) and stride S (`internal`, 1024):

    for start in range(0, L − R, S):                   # windows x[start : start + R + S]
        run the window alone (positions from 0), without a graph;
        target t ∈ [start + R, start + R + S) gets  w_t = exp(CE_short(t) − CE_long(t))
    every other target keeps w_t = 1;   w = min(w, γ);   loss = mean_t w_t · CE_long(t)

i.e. a target sees R … R + S − 1 tokens of short context. rsd-train adds document starts: a target
whose window would start at or before its document's start has its whole context as the short
context (weight 1). The reference below follows that loop literally on transformers' model (one
forward per window, per-document forwards for the long context), with autograd for the gradient
norm; `rsd-train probe` reports the weights it computed (`long_ce_weights`) next to the loss.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug).
"""
import json
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rsd_cli import run
from test_train import V, make_model, probe_args, reference

rsd_train = partial(run, "rsd-train")
B, L = 2, 37
GAMMA = 5.0


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("long_ce")
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, V, size=(B, L), dtype=np.int64)
    np.save(d / "tokens.npy", tokens)
    models = {f: make_model(f, d / f) for f in ("llama", "qwen3")}
    return d, tokens, models


def sliding_reference(model_dir, tokens, window, stride, gamma, dtype, docs=None, mask_doc_starts=False):
    """Standard-view LongCE loss, its weights [B, L] (0 where no label) and the gradient norm.

    docs: one boundary list [0, …, L] per row (document-masked attention, positions restarting at
    each document), as `rsd-train probe --docs`; with mask_doc_starts the last token of a document
    predicts nothing."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation="eager")
    ids = torch.from_numpy(tokens)
    b, l = ids.shape
    docs = docs or [[0, l]] * b

    def run(seq):
        n = seq.shape[-1]
        return m(input_ids=seq[None], position_ids=torch.arange(n)[None],
                 attention_mask=torch.ones(1, n, dtype=torch.long)).logits[0].to(dtype)

    total = torch.zeros((), dtype=dtype)
    weights = torch.zeros(b, l, dtype=torch.float64)
    labels = 0
    for r in range(b):
        cu = docs[r]
        doc_start = torch.tensor([max(c for c in cu[:-1] if c <= p) for p in range(l)])
        # Long context: each document on its own (exactly what document masking computes).
        long = torch.cat([F.log_softmax(run(ids[r, a:e]), -1) for a, e in zip(cu, cu[1:])])
        has_label = [p + 1 < l and not (mask_doc_starts and p + 1 in cu) for p in range(l)]
        w = torch.ones(l, dtype=dtype)
        with torch.no_grad():
            for start in range(0, l - window, stride):
                short = F.log_softmax(run(ids[r, start:start + window + stride]), -1)
                for t in range(start + window, min(start + window + stride, l)):
                    p = t - 1  # the logit row that predicts x_t
                    if start > doc_start[p]:
                        w[p] = torch.exp(long[p, ids[r, t]] - short[p - start, ids[r, t]])
        w = torch.clamp(w, max=gamma).detach()
        for p in range(l):
            if has_label[p]:
                total = total - w[p] * long[p, ids[r, p + 1]]
                weights[r, p] = w[p].item()
                labels += 1
    clm = total / labels
    clm.backward()
    gn = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in m.parameters() if p.grad is not None))
    return dict(clm=clm.item(), loss=clm.item(), grad_norm=gn.item(), weights=weights.numpy())


def probe(d, model_dir, dtype, window, stride, *extra, objective="standard", gamma=GAMMA, chunk=7):
    params = {"split": [5, 13], "skip": [7, 300]}
    out = rsd_train(*probe_args(model_dir, d / "tokens.npy", objective, "skip", params, "reverse", 1.0,
                                dtype, chunk=chunk),
                    "--long-ce-window", window, "--long-ce-stride", stride, "--long-ce-gamma", gamma, *extra)
    return json.loads(out.stdout)


# fp64 is limited by RMSNorm, which computes in fp32 (in transformers, and in rsd-model to match it).
TOL = {"fp64": 1e-6, "fp32": 1e-5}


def check(out, ref, dtype):
    tol = TOL[dtype]
    np.testing.assert_allclose(np.array(out["long_ce_weights"]), ref["weights"], rtol=tol, atol=tol)
    for k in ("clm", "loss", "grad_norm"):
        assert out[k] == pytest.approx(ref[k], rel=tol, abs=tol), (k, out[k], ref[k])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
@pytest.mark.parametrize("window,stride", [(6, 4), (5, 3), (8, 8)])
def test_sliding_windows_match_pytorch(setup, family, dtype, window, stride):
    """L = 37 is no multiple of the strides; the weights must really vary for this to mean anything."""
    d, tokens, models = setup
    tdtype = torch.float64 if dtype == "fp64" else torch.float32
    ref = sliding_reference(models[family], tokens, window, stride, GAMMA, tdtype)
    w = ref["weights"][:, : L - 1]
    assert (np.abs(w - 1) > 1e-2).sum() >= 10 and (w[:, : window - 1] == 1).all(), w
    check(probe(d, models[family], dtype, window, stride), ref, dtype)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
@pytest.mark.parametrize("mask", [False, True], ids=["labels-across", "mask-doc-starts"])
def test_document_starts_cut_the_short_context(setup, family, dtype, mask):
    d, tokens, models = setup
    tdtype = torch.float64 if dtype == "fp64" else torch.float32
    docs = [[0, 11, 30, L], [0, 4, L]]
    ref = sliding_reference(models[family], tokens, 4, 3, GAMMA, tdtype, docs=docs, mask_doc_starts=mask)
    # Rows 11 … 13 of row 0 have fewer than 4 tokens of their document: weight exactly 1.
    assert (ref["weights"][0, 11:14] == 1).all() and (np.abs(ref["weights"] - 1) > 1e-2).sum() >= 10
    extra = ["--docs", ";".join(",".join(map(str, c)) for c in docs)] + (["--mask-doc-starts"] if mask else [])
    out = probe(d, models[family], dtype, 4, 3, *extra)
    check(out, ref, dtype)
    plain = probe(d, models[family], dtype, 4, 3)
    assert plain["clm"] != pytest.approx(out["clm"], rel=1e-3), "documents changed nothing"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_with_rsd_the_kl_term_is_unchanged_and_the_clm_term_is_longce(setup, family):
    d, tokens, models = setup
    tdtype = torch.float64
    ref = sliding_reference(models[family], tokens, 6, 4, GAMMA, tdtype)
    plain = json.loads(rsd_train(*probe_args(models[family], d / "tokens.npy", "rsd", "skip",
                                             {"split": [5, 13], "skip": [7, 300]}, "reverse", 1.0,
                                             "fp64")).stdout)
    out = probe(d, models[family], "fp64", 6, 4, objective="rsd")
    assert out["clm"] == pytest.approx(ref["clm"], rel=1e-6)
    assert out["kl"] == pytest.approx(plain["kl"], rel=1e-9) and out["kl"] > 1e-4
    assert out["loss"] == pytest.approx(ref["clm"] + plain["kl"], rel=1e-6)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("k", [5, 8])
def test_reference_one_stride_k_reproduces_the_old_non_overlapping_windows(setup, family, k):
    """The earlier LongCE cut the sequence into consecutive K-token windows (tests/test_train.py's
    `reference(long_ce=(K, γ))`); that is reference length 1 with stride K."""
    d, tokens, models = setup
    old = reference(models[family], tokens, "standard", "skip", {"split": [5, 5], "skip": [1, 1]},
                    "reverse", 1.0, torch.float32, long_ce=(k, GAMMA))
    out = probe(d, models[family], "fp32", 1, k)
    for key in ("clm", "loss", "grad_norm"):
        assert out[key] == pytest.approx(old[key], rel=1e-5), (key, out[key], old[key])


def test_loss_chunk_does_not_change_the_weights(setup):
    d, _, models = setup
    a = probe(d, models["llama"], "fp64", 5, 3, chunk=1)
    b = probe(d, models["llama"], "fp64", 5, 3, chunk=1024)
    np.testing.assert_allclose(a["long_ce_weights"], b["long_ce_weights"], rtol=1e-9, atol=1e-9)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-9)


@pytest.mark.parametrize("flags,named", [
    (["--long-ce-window", 4, "--long-ce-stride", 0], "long_ce_stride"),
    (["--long-ce-window", 4, "--long-ce-stride=-3"], "long_ce_stride"),
    (["--long-ce-window=-2"], "long_ce_window"),
    (["--long-ce-window", 4, "--long-ce-gamma=-1"], "long_ce_gamma"),
])
def test_bad_settings_are_named(setup, flags, named):
    d, _, models = setup
    p = rsd_train("probe", "--model", models["llama"], "--tokens", d / "tokens.npy", "--objective",
                  "standard", *flags, check=False)
    assert p.returncode != 0 and named in p.stderr, p.stderr
