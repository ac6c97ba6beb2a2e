"""The paper's control ablations (its Tables 5 and 7) against an independent PyTorch implementation.

`rsd-train probe --objective rsd --perturb {nope,attn-noise,dropout}` must give the CLM term, the
KL term, the total loss and every parameter gradient of the formulas written out below on
transformers' own Llama and Qwen3 (eager attention, full logits, autograd), within 1e-5 relative
in fp32:

    nope:        view 2 = the same tokens with queries and keys not rotated (transformers'
                 apply_rotary_pos_emb replaced by the identity); KL rows: i ≥ 1.
    attn-noise:  view 2 = attention scores q·kᵀ/√d + N(0, σ²) before the softmax; KL rows: i ≥ 1.
    dropout:     both views drop attention probabilities (rate p, kept ones scaled by 1/(1 − p));
                 CLM on view 1; KL rows: every row.
    CLM  = mean over label tokens of −log p_1(x_{i+1} | x_≤i)
    KL_b = mean over sample b's KL rows of KL(p_2 ‖ sg(p_1))  (reverse; forward: KL(sg(p_1) ‖ p_2))
    loss = CLM + λ · mean_b KL_b

The randomness is reproduced, not copied: row r's draws for layer i of pass k (0 = view 1,
1 = view 2) come from torch.manual_seed(seed_r + 2·i + k) then torch.randn(H, L, L)·σ (noise) or
torch.rand(H, L, L) ≥ p (dropout's kept entries), with seed_r as the probe reports it. The probe's
--dump file must hold exactly these tensors.

Binaries: $RSD_BIN_DIR (default <repo>/target/debug).
"""
import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from rsd_cli import fails, run
from test_train import make_model

REPO = Path(__file__).resolve().parent.parent
B, L, V = 2, 24, 89
rsd_train = partial(run, "rsd-train")
KIND_ROWS = {"nope": 1, "attn-noise": 1, "dropout": 0}  # first KL row of a sequence


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("train_ablations")
    tokens = np.random.default_rng(1).integers(0, V, size=(B, L), dtype=np.int64)
    np.save(d / "tokens.npy", tokens)
    models = {f: make_model(f, d / f) for f in ("llama", "qwen3")}
    return d, tokens, models


def draws(kind, seeds, layers, heads, l, sigma, rate, pass_):
    """Per layer, [B, H, L, L]: the noise (attn-noise) or the kept entries (dropout) of one pass."""
    out = []
    for i in range(layers):
        rows = []
        for s in seeds:
            torch.manual_seed(s + 2 * i + pass_)
            if kind == "attn-noise":
                rows.append(torch.randn(heads, l, l) * sigma)
            else:
                rows.append(torch.rand(heads, l, l) >= rate)
        out.append(torch.stack(rows))
    return out


def reference(family, model_dir, tokens, kind, kl_dir, lam, seeds, sigma, rate, kl_norm="rows"):
    """The control ablation's loss with transformers' model, its attention and RoPE patched."""
    from transformers import AutoModelForCausalLM
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen3 import modeling_qwen3

    mod = modeling_llama if family == "llama" else modeling_qwen3
    m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    c = m.config
    ids = torch.from_numpy(tokens)
    b, l = ids.shape
    state = {"noise": None, "keep": None, "nope": False}

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        k = mod.repeat_kv(key, module.num_key_value_groups)
        v = mod.repeat_kv(value, module.num_key_value_groups)
        w = torch.matmul(query, k.transpose(2, 3)) * scaling
        if state["noise"] is not None:
            w = w + state["noise"][module.layer_idx]
        w = w + attention_mask[:, :, :, : k.shape[-2]]
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
        if state["keep"] is not None:
            w = w * state["keep"][module.layer_idx].to(w.dtype) / (1.0 - rate)
        return torch.matmul(w, v).transpose(1, 2).contiguous(), w

    rotary = mod.apply_rotary_pos_emb

    def maybe_rotary(q, k, cos, sin, *a, **kw):
        return (q, k) if state["nope"] else rotary(q, k, cos, sin, *a, **kw)

    def logits(**st):
        state.update({"noise": None, "keep": None, "nope": False, **st})
        pos = torch.arange(l).expand(b, l)
        return m(input_ids=ids, position_ids=pos, attention_mask=torch.ones(b, l, dtype=torch.long)).logits

    saved = (mod.eager_attention_forward, mod.apply_rotary_pos_emb)
    mod.eager_attention_forward, mod.apply_rotary_pos_emb = attention, maybe_rotary
    try:
        d = partial(draws, kind, seeds, c.num_hidden_layers, c.num_attention_heads, l, sigma, rate)
        if kind == "nope":
            ls, lp = logits(), logits(nope=True)
        elif kind == "attn-noise":
            ls, lp = logits(), logits(noise=d(1))
        else:
            ls, lp = logits(keep=d(0)), logits(keep=d(1))
    finally:
        mod.eager_attention_forward, mod.apply_rotary_pos_emb = saved
    clm = F.cross_entropy(ls[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    logq, logp = F.log_softmax(ls.detach(), -1), F.log_softmax(lp, -1)
    rows = list(range(KIND_ROWS[kind], l))
    kl = torch.zeros(())
    for r in range(b):
        if kl_dir == "reverse":
            k = (logp[r, rows].exp() * (logp[r, rows] - logq[r, rows])).sum(-1)
        else:
            k = (logq[r, rows].exp() * (logq[r, rows] - logp[r, rows])).sum(-1)
        kl = kl + k.sum() / (len(rows) if kl_norm == "rows" else l)
    kl = kl / b
    loss = clm + lam * kl
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    gn = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values()))
    return dict(clm=clm.item(), kl=kl.item(), loss=loss.item(), grad_norm=gn.item()), grads


def probe(model_dir, tok, kind, *extra, kl_dir="reverse", lam=1.0, sigma=1.0, rate=0.1, seed=0):
    a = ["probe", "--model", model_dir, "--tokens", tok, "--objective", "rsd", "--perturb", kind,
         "--kl", kl_dir, "--lambda", lam, "--dtype", "fp32", "--loss-chunk", 7, "--seed", seed,
         "--attn-noise-sigma", sigma, "--attn-dropout", rate, *extra]
    return json.loads(rsd_train(*a).stdout)


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


CASES = [
    ("nope", "reverse", 1.0, {}),
    ("nope", "forward", 0.5, {}),
    ("attn-noise", "reverse", 1.0, {"sigma": 0.5}),
    ("attn-noise", "forward", 1.0, {"sigma": 2.0}),
    ("dropout", "reverse", 1.0, {"rate": 0.1}),
    ("dropout", "forward", 0.5, {"rate": 0.3}),
]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-l{c[2]}")
def test_probe_matches_pytorch(setup, tmp_path, family, case):
    d, tokens, models = setup
    kind, kl_dir, lam, params = case
    sigma, rate = params.get("sigma", 1.0), params.get("rate", 0.1)
    gpath, dump = tmp_path / "grads.safetensors", tmp_path / "draws.safetensors"
    out = probe(models[family], d / "tokens.npy", kind, "--grads-out", gpath, "--dump", dump,
                kl_dir=kl_dir, lam=lam, sigma=sigma, rate=rate, seed=7)
    seeds = [r["seed"] for r in out["rows"]]
    assert len(set(seeds)) == B and all(r["kl_rows"] == L - KIND_ROWS[kind] for r in out["rows"])
    ref, grads = reference(family, models[family], tokens, kind, kl_dir, lam, seeds, sigma, rate)
    for k in ("clm", "kl", "loss", "grad_norm"):
        assert rel(out[k], ref[k]) < 1e-5, (k, out[k], ref[k])
    assert ref["kl"] > 1e-4, "the KL must be non-trivial for the comparison to mean something"
    ours = load_file(gpath)
    assert set(ours) == set(grads), (sorted(ours), sorted(grads))
    for n, g in grads.items():
        err = (ours[n] - g).norm().item()
        assert err <= 1e-5 * g.norm().item() + 1e-7, (n, err, g.norm().item())
    # The draws PyTorch made from the reported seeds are the ones the step used, bit for bit.
    dumped = load_file(dump)
    if kind == "nope":
        assert dumped == {}
    else:
        heads = 4
        passes = {"attn-noise": [(1, "perturbed", "score_noise")],
                  "dropout": [(0, "standard", "keep"), (1, "perturbed", "keep")]}[kind]
        names = set()
        for pass_, view, what in passes:
            for i, t in enumerate(draws(kind, seeds, 2, heads, L, sigma, rate, pass_)):
                name = f"layers.{i}.{view}.{what}"
                names.add(name)
                assert torch.equal(dumped[name].to(t.dtype), t), name
        assert set(dumped) == names


@pytest.mark.parametrize("kind", ["nope", "attn-noise", "dropout"])
def test_checkpointing_length_norm_and_prefix_reuse(setup, kind):
    """Activation checkpointing recomputes the same draws (same loss and gradient); kl_norm =
    length divides by L; prefix reuse does not apply (the same numbers with it off)."""
    d, tokens, models = setup
    tok, model = d / "tokens.npy", models["qwen3"]
    base = probe(model, tok, kind, seed=3)
    for extra in (["--checkpoint-layers"], ["--no-prefix-reuse"]):
        other = probe(model, tok, kind, *extra, seed=3)
        for k in ("clm", "kl", "loss", "grad_norm"):
            assert rel(other[k], base[k]) < 1e-6, (extra, k, other[k], base[k])
    out = probe(model, tok, kind, "--kl-norm", "length", seed=3)
    seeds = [r["seed"] for r in out["rows"]]
    ref, _ = reference("qwen3", model, tokens, kind, "reverse", 1.0, seeds, 1.0, 0.1, kl_norm="length")
    for k in ("clm", "kl", "loss", "grad_norm"):
        assert rel(out[k], ref[k]) < 1e-5, (k, out[k], ref[k])


def test_zero_noise_and_zero_dropout_give_zero_kl(setup):
    d, _, models = setup
    tok = d / "tokens.npy"
    for family in ("llama", "qwen3"):
        model = models[family]
        standard = json.loads(rsd_train("probe", "--model", model, "--tokens", tok, "--objective",
                                        "standard", "--dtype", "fp32").stdout)
        for kind, params in (("attn-noise", {"sigma": 0.0}), ("dropout", {"rate": 0.0})):
            out = probe(model, tok, kind, **params)
            assert out["kl"] == 0.0, (family, kind, out["kl"])
            assert rel(out["clm"], standard["clm"]) < 1e-6
            assert rel(out["grad_norm"], standard["grad_norm"]) < 1e-5
            # A nonzero value really changes the second view (the zero is not vacuous).
            assert probe(model, tok, kind, **{k: 0.3 for k in params})["kl"] > 1e-4


def test_same_seed_same_loss_other_seed_other_loss(setup):
    d, _, models = setup
    tok, model = d / "tokens.npy", models["llama"]
    for kind in ("attn-noise", "dropout"):
        a, b = probe(model, tok, kind, seed=11), probe(model, tok, kind, seed=11)
        assert (a["loss"], a["grad_norm"], a["rows"]) == (b["loss"], b["grad_norm"], b["rows"])
        c = probe(model, tok, kind, seed=12)
        assert c["kl"] != a["kl"] and c["rows"][0]["seed"] != a["rows"][0]["seed"]
    # NoPE has no randomness: the seed changes nothing.
    assert probe(model, tok, "nope", seed=1)["loss"] == probe(model, tok, "nope", seed=2)["loss"]


def test_bad_values_and_incompatible_options_are_named(setup, tmp_path):
    d, _, models = setup
    base = ["probe", "--model", models["llama"], "--tokens", d / "tokens.npy"]
    cases = [
        (["--perturb", "attn-noise", "--attn-noise-sigma", "-0.5"], "attn_noise_sigma -0.5"),
        (["--perturb", "dropout", "--attn-dropout", "1"], "attn_dropout 1"),
        (["--perturb", "dropout", "--attn-dropout", "-0.1"], "attn_dropout -0.1"),
        (["--perturb", "nope", "--cp", "2"], "--cp 2: perturb nope"),
        (["--perturb", "dropout", "--objective", "pose"], "objective pose"),
        (["--perturb", "attn-noise", "--objective", "two-view-clm"], "objective two-view-clm"),
        (["--perturb", "dropout", "--long-ce-window", "4"], "long_ce_window"),
        (["--perturb", "nope", "--reference"], "no control views"),
    ]
    for extra, msg in cases:
        e = fails("rsd-train", *base, *extra).stderr
        assert msg in e, (extra, e)
    # Training configs refuse them before anything is written, naming the key and the value.
    train = ["--init", REPO / "configs" / "model" / "tiny-qwen3-64.json", "--out", tmp_path / "run",
             "--print-config"]
    cases = [
        (["--attn-noise-sigma=-1"], "attn_noise_sigma -1"),
        (["--attn-dropout", "1.5"], "attn_dropout 1.5"),
        (["--perturb", "nope", "--cp", "2"], "config key cp: 2"),
        (["--perturb", "dropout", "--objective", "pose"], "config key perturb"),
        (["--perturb", "dropout", "--long-ce-window", "8"], "config key long_ce_window: 8"),
    ]
    for extra, msg in cases:
        e = fails("rsd-train", *train, *extra).stderr
        assert msg in e, (extra, e)
    out = rsd_train(*train, "--perturb", "attn-noise", "--attn-noise-sigma", "0.25").stdout
    assert 'perturb = "attn-noise"' in out and "attn_noise_sigma = 0.25" in out


def test_training_loop_is_reproducible(shards, tmp_path):
    """Each control view trains (the KL is logged), the same seed gives the same losses, another
    seed other ones, and activation checkpointing does not change them."""
    def train(out, *extra):
        run("rsd-train", "--config", REPO / "configs" / "tiny-cpu.toml", "--shards", shards,
            "--init", REPO / "configs" / "model" / "tiny-qwen3-64.json", "--out", out,
            "--progress", "false", "--threads", "2", "--steps", 2, "--lr", 5e-3, *extra)
        return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]

    for kind in ("nope", "attn-noise", "dropout"):
        a = train(tmp_path / f"{kind}-a", "--perturb", kind)
        assert len(a) == 2 and all(r["kl"] > 0 for r in a), a
        if kind == "nope":
            continue
        b = train(tmp_path / f"{kind}-b", "--perturb", kind, "--checkpoint-layers", "true")
        c = train(tmp_path / f"{kind}-c", "--perturb", kind, "--seed", 5)
        # Step 1 is the same draws on the same weights; step 2 also inherits the rounding
        # differences of step 1's (recomputed) gradients through the update.
        for x, y, tol in zip(a, b, (1e-6, 1e-4)):
            for k in ("loss", "clm", "kl"):
                assert rel(y[k], x[k]) < tol, (kind, x["step"], k, x[k], y[k])
        assert a[0]["kl"] != c[0]["kl"]
