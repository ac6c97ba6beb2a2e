"""rsd-train against an independent plain-PyTorch implementation of the paper's formulas.

`rsd-train probe` (our chunked, prefix-reusing step) must give the same CLM term, KL term, total
loss and global gradient norm as the formulas written out below on transformers' own model
(full logits, two full forward passes, autograd), for: standard CLM; RSD with the skip view
(reverse and forward KL, per-sample (s, y), fixed (s, y), λ ≠ 1); RSD with the cyclic view and with
the chunk-permute view (`--order`); PoSE (CLM on the perturbed view). Llama and Qwen3, fp64 (tight) and fp32.

The paper's loss, for sample b with split s_b and skip y_b (r_i = i for i < s, i + y for i ≥ s):
    CLM  = mean over label tokens of −log p_std(x_{i+1} | x_≤i)
    KL_b = 1/(L − s_b) · Σ_{i=s_b}^{L−1} KL(p_pert(·|x_≤i) ‖ sg(p_std(·|x_≤i)))   (reverse)
    loss = CLM + λ · mean_b KL_b
For the cyclic view r_i = (i + u) mod L the rows are i = L−u … L−1 (see docs/TRAIN.md).
transformers needs attention_mask=ones with jumping position ids (docs/DESIGN.md, "Facts").

Binaries: $RSD_BIN_DIR (default <repo>/target/debug).
"""
import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rsd_cli import run

REPO = Path(__file__).resolve().parent.parent
B, L, V = 2, 24, 89
rsd_train = partial(run, "rsd-train")


def make_model(family, path):
    torch.manual_seed(0)
    if family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
                          tie_word_embeddings=False, max_position_embeddings=512)
        m = LlamaForCausalLM(cfg)
    else:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        cfg = Qwen3Config(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          rope_theta=1e6, tie_word_embeddings=True, max_position_embeddings=512)
        m = Qwen3ForCausalLM(cfg)
    # Larger weights than the init so the two views really differ (a non-trivial KL).
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    m.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("train_parity")
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, size=(B, L), dtype=np.int64)
    np.save(d / "tokens.npy", tokens)
    models = {f: make_model(f, d / f) for f in ("llama", "qwen3")}
    return d, tokens, models


def reference(model_dir, tokens, objective, perturb, params, kl_dir, lam, dtype, long_ce=None):
    """The paper's formulas with transformers' model, full logits and autograd.

    long_ce = (K, γ): the CLM term is LongCE's, Σ_i w_i·CE_i / N with the constant weight
    w_i = min(exp(log p(x_i | full context) − log p(x_i | short context)), γ); the short context
    is computed here by running every K-token window of the sequence as its own sequence."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation="eager")
    ids = torch.from_numpy(tokens)
    b, l = ids.shape
    i = torch.arange(l)
    mask = torch.ones(b, l, dtype=torch.long)

    def logits(pos):
        return m(input_ids=ids, position_ids=pos, attention_mask=mask).logits.to(dtype)

    def ce(lg):
        if long_ce is None:
            return F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), ids[:, 1:].reshape(-1))
        k, gamma = long_ce
        with torch.no_grad():
            short = torch.cat([m(input_ids=ids[:, c:c + k], position_ids=torch.arange(min(k, l - c)).expand(b, -1),
                                 attention_mask=mask[:, c:c + k]).logits.to(dtype) for c in range(0, l, k)], 1)
        target = ids[:, 1:].unsqueeze(-1)
        lp_long = F.log_softmax(lg[:, :-1], -1).gather(-1, target).squeeze(-1)
        lp_short = F.log_softmax(short[:, :-1], -1).gather(-1, target).squeeze(-1)
        w = torch.clamp(torch.exp(lp_long - lp_short), max=gamma).detach()
        return (w * -lp_long).sum() / lp_long.numel()

    pos, rows = [], []
    for r in range(b):
        if perturb == "skip":
            s, y = params["split"][r], params["skip"][r]
            pos.append(torch.where(i < s, i, i + y))
            rows.append(list(range(s, l)))
        elif perturb == "chunk-permute":
            # Chunk k of c near-equal chunks ([k·l/c, (k+1)·l/c)) moves to rank order[k]; rows
            # differ from the first token whose offset differs from the first token's.
            order = params["order"]
            c = len(order)
            bounds = [k * l // c for k in range(c + 1)]
            lens = [bounds[k + 1] - bounds[k] for k in range(c)]
            starts = [sum(lens[j] for j in range(c) if order[j] < order[k]) for k in range(c)]
            p = torch.cat([torch.arange(starts[k], starts[k] + lens[k]) for k in range(c)])
            delta = p - i
            first = next((j for j in range(l) if delta[j] != delta[0]), l)
            pos.append(p)
            rows.append(list(range(first, l)))
        else:
            u = params["shift"][r]
            pos.append((i + u) % l)
            rows.append(list(range(l - u, l)))
    pos = torch.stack(pos)
    std_pos = i.expand(b, l)
    kl = torch.zeros((), dtype=dtype)
    if objective == "standard":
        clm = ce(logits(std_pos))
    elif objective == "pose":
        clm = ce(logits(pos))
    else:
        ls, lp = logits(std_pos), logits(pos)
        logq = F.log_softmax(ls.detach(), -1)
        logp = F.log_softmax(lp, -1)
        for r in range(b):
            rr = rows[r]
            if kl_dir == "reverse":
                k = (logp[r, rr].exp() * (logp[r, rr] - logq[r, rr])).sum(-1)
            else:
                k = (logq[r, rr].exp() * (logq[r, rr] - logp[r, rr])).sum(-1)
            kl = kl + k.mean()
        kl = kl / b
        clm = ce(ls)
    loss = clm + lam * kl
    loss.backward()
    gn = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in m.parameters() if p.grad is not None))
    return dict(clm=clm.item(), kl=kl.item(), loss=loss.item(), grad_norm=gn.item())


CASES = [
    ("standard", "skip", {"split": [5, 5], "skip": [1, 1]}, "reverse", 1.0),
    ("rsd", "skip", {"split": [5, 13], "skip": [7, 300]}, "reverse", 1.0),
    ("rsd", "skip", {"split": [5, 13], "skip": [7, 300]}, "forward", 1.0),
    ("rsd", "skip", {"split": [9, 9], "skip": [40, 40]}, "reverse", 0.5),  # fixed (s, y)
    ("rsd", "cyclic", {"shift": [3, 17]}, "reverse", 1.0),
    ("rsd", "cyclic", {"shift": [11, 2]}, "forward", 1.0),
    ("pose", "skip", {"split": [6, 0], "skip": [50, 9]}, "reverse", 1.0),
    ("rsd", "chunk-permute", {"order": [2, 0, 1]}, "reverse", 1.0),
    ("rsd", "chunk-permute", {"order": [1, 0, 3, 2]}, "forward", 1.0),
]


def probe_args(model_dir, tok, objective, perturb, params, kl_dir, lam, dtype, chunk=7):
    a = ["probe", "--model", model_dir, "--tokens", tok, "--objective", objective,
         "--perturb", perturb, "--kl", kl_dir, "--lambda", lam, "--dtype", dtype, "--loss-chunk", chunk]
    for k, v in params.items():
        a += [f"--{k}", ",".join(map(str, v))]
    return a


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}-l{c[4]}")
@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
def test_probe_matches_pytorch_reference(setup, family, case, dtype):
    d, tokens, models = setup
    objective, perturb, params, kl_dir, lam = case
    tdtype = torch.float64 if dtype == "fp64" else torch.float32
    ref = reference(models[family], tokens, objective, perturb, params, kl_dir, lam, tdtype)
    out = json.loads(rsd_train(*probe_args(models[family], d / "tokens.npy", objective, perturb,
                                            params, kl_dir, lam, dtype)).stdout)
    # fp64: limited by RMSNorm, which computes in fp32 even for fp64 models (in transformers, and in
    # rsd-model to match it); fp32: by fp32 itself.
    rtol = 1e-6 if dtype == "fp64" else 2e-4
    for k in ("clm", "kl", "loss", "grad_norm"):
        assert out[k] == pytest.approx(ref[k], rel=rtol, abs=1e-9 if dtype == "fp64" else 1e-6), (k, out, ref)
    if objective == "rsd":
        assert ref["kl"] > 1e-4, "the KL must be non-trivial for the comparison to mean something"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("objective,window,gamma", [("standard", 8, 5.0), ("rsd", 8, 5.0), ("rsd", 5, 1.2)])
def test_long_ce_matches_pytorch_reference(setup, family, objective, window, gamma):
    """The earlier non-overlapping LongCE (reference length 1, stride K: consecutive K-token
    windows; tests/test_long_ce.py checks the paper's sliding windows) alone and with RSD, fp64,
    against the formula with short contexts run as separate sequences; the weights must really
    differ from 1 for the test to mean something."""
    d, tokens, models = setup
    params = {"split": [5, 13], "skip": [7, 300]}
    ref = reference(models[family], tokens, objective, "skip", params, "reverse", 1.0, torch.float64,
                    long_ce=(window, gamma))
    plain = reference(models[family], tokens, objective, "skip", params, "reverse", 1.0, torch.float64)
    assert abs(ref["clm"] - plain["clm"]) > 1e-3 * plain["clm"], "LongCE weights are all ≈ 1"
    out = json.loads(rsd_train(*probe_args(models[family], d / "tokens.npy", objective, "skip", params,
                                            "reverse", 1.0, "fp64"),
                               "--long-ce-window", 1, "--long-ce-stride", window, "--long-ce-gamma", gamma).stdout)
    for k in ("clm", "kl", "loss", "grad_norm"):
        assert out[k] == pytest.approx(ref[k], rel=1e-6, abs=1e-9), (k, out, ref)  # fp32 RMSNorm, see above


def test_long_ce_refuses_objectives_without_a_standard_clm_term(setup):
    d, _, models = setup
    p = rsd_train(*probe_args(models["llama"], d / "tokens.npy", "pose", "skip", {"split": [5, 5], "skip": [3, 3]},
                              "reverse", 1.0, "fp64"), "--long-ce-window", 8, check=False)
    assert p.returncode == 1 and "LongCE" in p.stderr and "objective pose" in p.stderr


def test_prefix_reuse_and_checkpointing_do_not_change_the_probe(setup):
    d, _, models = setup
    def base(chunk=7):
        return probe_args(models["qwen3"], d / "tokens.npy", "rsd", "skip",
                          {"split": [5, 13], "skip": [7, 300]}, "reverse", 1.0, "fp64", chunk)
    runs = [json.loads(rsd_train(*base(), *extra).stdout)
            for extra in ([], ["--no-prefix-reuse"], ["--checkpoint-layers"], ["--reference"])]
    runs.append(json.loads(rsd_train(*base(1)).stdout))
    assert runs[0]["rows"][1]["shared_prefix"] == 13
    for r in runs[1:]:
        for k in ("clm", "kl", "loss", "grad_norm"):
            # fp64 runs: RMSNorm computes in fp32 (as transformers does), and the variants order
            # their operations differently, so agreement is to ~1e-9, not to fp64 rounding.
            assert r[k] == pytest.approx(runs[0][k], rel=1e-8), k


def test_probe_chunk_permute_uses_the_order_given(setup):
    d, tokens, models = setup

    def probe(order):
        return json.loads(rsd_train("probe", "--model", models["llama"], "--tokens", d / "tokens.npy",
                                    "--perturb", "chunk-permute", "--order", order, "--dtype", "fp64").stdout)

    out = probe("2,0,1")
    assert [r["perturbation"]["order"] for r in out["rows"]] == [[2, 0, 1]] * B
    # Chunks [0,8) [8,16) [16,24) placed at ranks 2,0,1: chunk 0 moves as a block (its rows see
    # only themselves and are unchanged); every row from the second chunk on differs.
    assert [r["kl_rows"] for r in out["rows"]] == [L - 8] * B and out["kl"] > 0
    # The identity order moves nothing: no KL; another order gives another KL.
    same = probe("0,1,2")
    assert same["kl"] == 0 and all(r["kl_rows"] == 0 for r in same["rows"])
    assert probe("1,2,0")["kl"] != pytest.approx(out["kl"])
    p = rsd_train("probe", "--model", models["llama"], "--tokens", d / "tokens.npy",
                  "--perturb", "chunk-permute", "--order", "0,0,1", check=False)
    assert p.returncode == 1 and "--order 0,0,1" in p.stderr and "permutation" in p.stderr


def test_probe_errors_are_clear(setup):
    d, _, models = setup
    p = rsd_train("probe", "--model", models["llama"], "--tokens", d / "tokens.npy",
                  "--perturb", "skip", "--split", "1,2,3", "--skip", "1", check=False)
    assert p.returncode == 1 and "3 values for 2 samples" in p.stderr
    p = rsd_train("probe", "--model", d / "nope", "--tokens", d / "tokens.npy", check=False)
    assert p.returncode == 1 and "nope" in p.stderr
    # An id outside the vocabulary is named with its file, row and column, not libtorch's
    # "index out of range in self"; a negative one too.
    vocab = json.loads((Path(models["llama"]) / "config.json").read_text())["vocab_size"]
    for bad, dtype in ((vocab, np.int64), (-1, np.int32)):
        rows = np.load(d / "tokens.npy").astype(dtype)
        rows[1, 3] = bad
        np.save(d / "bad.npy", rows)
        p = rsd_train("probe", "--model", models["llama"], "--tokens", d / "bad.npy", check=False)
        assert p.returncode == 1, p.stderr
        assert (f"bad.npy: token id {bad} at row 1, column 3 is not in the model's vocabulary "
                f"[0, {vocab})") in p.stderr, p.stderr
        assert "index out of range" not in p.stderr
