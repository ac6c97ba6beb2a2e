"""Loader benchmark against real peers on the same tokens (docs/BENCHMARKS.md, "rsd-loader").

For one rsd shard directory (make one with `rsd-data bench DIR --synthetic-tokens 2e8 --len 65536`):
  * rsd-loader, through `rsd-data bench --json` (release build): sequential/shuffled, 1..N workers,
    memcpy limit, first-batch latency, RSS;
  * the same loader from Python (`import rsd`, the package in python/), in this process: torch
    tensors over its int32 buffers, or widened to int64; and its RSS over --rss-epochs epochs; and
    --pairs interleaved Rust/Python passes per worker count, the ratio taken within each pair;
  * nanoGPT-style np.memmap reader: random windows of L+1 tokens → int64 x, y;
  * megatron-core IndexedDataset: random samples (documents) read sequence by sequence → int64;
  * mosaicml-streaming StreamingDataset over MDS shards written from the same samples → int64.
Each reader is timed for --seconds after one warm-up pass over the page cache. Peers produce int64
arrays (what they hand a trainer); rsd-loader's full layout produces int32 tokens + labels + position
ids, its compact layout the ids as stored plus what labels and positions follow from.

    python benches/loader_peers.py --dir /tmp/bench64k --bin target-loader/release/rsd-data --json-out out.json
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def timed(name, step, seconds, tokens_per_step_fn=None):
    """Call step() until `seconds` pass; step returns tokens read."""
    t0 = time.perf_counter()
    first = step()
    first_ms = (time.perf_counter() - t0) * 1e3
    tokens, n, t1 = 0, 0, time.perf_counter()
    rss0 = rss_mib()
    rss_max = rss0
    while time.perf_counter() - t1 < seconds:
        tokens += step()
        n += 1
        if n % 16 == 0:
            rss_max = max(rss_max, rss_mib())
    dt = time.perf_counter() - t1
    out = {"reader": name, "tokens_per_s": tokens / dt, "samples": n, "seconds": dt, "first_ms": first_ms,
           "rss_start_mib": rss0, "rss_max_mib": rss_max, "first_tokens": int(first)}
    print(f"{name:>28}: {tokens / dt / 1e6:8.1f} M tok/s  ({n} samples in {dt:.1f}s), RSS {rss0:.0f}→{rss_max:.0f} MiB", flush=True)
    return out


def rsd_bench(args, *flags):
    """`rsd-data bench --json` on --dir with these flags: its records, one per line."""
    res = subprocess.run([str(args.bin), "bench", str(args.dir), "--json", "--seconds", str(args.seconds), *flags],
                         capture_output=True, text=True, check=True)
    return [json.loads(line) for line in res.stdout.splitlines()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--bin", type=Path, default=Path("target-loader/release/rsd-data"))
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds per pass (rsd-data bench runs 3 rounds per row)")
    ap.add_argument("--mds-samples", type=int, default=1024, help="samples written to MDS for streaming")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--skip-rsd", action="store_true")
    ap.add_argument("--pairs", type=int, default=5,
                    help="interleaved pairs per worker count: Rust full/pread/shuffled, then Python int32, "
                         "each for --seconds; the ratio is taken within each pair (0: none)")
    ap.add_argument("--rss-epochs", type=int, default=2,
                    help="whole epochs the Python loader reads while its RSS is sampled (0: none)")
    args = ap.parse_args()

    manifest = json.loads((args.dir / "index.json").read_text())
    L = manifest["seq_len"]
    dtype = np.uint16 if manifest["dtype"] == "uint16" else np.int32
    results = {"dir": str(args.dir), "seq_len": L, "tokens": manifest["totals"]["tokens"], "readers": []}
    rng = np.random.default_rng(0)

    # rsd-loader (separate process, release build), in the same run.
    if not args.skip_rsd:
        for rec in rsd_bench(args, "--workers", args.workers):
            results["readers"].append({"reader": "rsd-loader", **rec})
            if rec["what"] == "memcpy_limit":
                print(f"{'memcpy limit':>28}: {rec['bytes_per_s'] / 1e9:8.2f} GB/s = {rec['bytes_per_s'] / np.dtype(dtype).itemsize / 1e6:.1f} M tok/s")
            elif rec["what"] == "sample_copies":
                print(f"{'sample copies ' + rec['order']:>28}: {rec['mapped_bytes_per_s'] / 1e9:8.2f} GB/s from a built mapping, "
                      f"{rec['fresh_mapping_bytes_per_s'] / 1e9:.2f} GB/s with pages released as the loader does, "
                      f"{rec['pread_bytes_per_s'] / 1e9:.2f} GB/s with pread")
            else:
                reports = [x["report"] for x in rec["rounds"]]
                first_ms = sorted(r["first_batch_ms"] for r in reports)[len(reports) // 2]
                name = f"rsd-loader {rec['layout']} {rec['read']} {rec['order']} w{rec['workers']}"
                print(f"{name:>42}: {rec['tokens_per_s'] / 1e6:8.1f} M tok/s "
                      f"({100 * rec['fraction_of_memcpy']:.0f}% of memcpy, median of {len(reports)}), first batch {first_ms:.1f} ms, "
                      f"RSS max {max(r['rss_max'] for r in reports) / 2**20:.0f} MiB", flush=True)

    # The same loader from Python (`import rsd`, python/): batches as torch tensors over the
    # loader's buffers. int32 hands those buffers over as they are (what `rsd-data bench`'s full
    # layout makes); int64 widens the ids, labels and positions once (what embeddings and
    # cross_entropy take).
    import rsd

    for int64 in (False, True):
        for workers in map(int, args.workers.split(",")):
            loader = rsd.Loader(args.dir, micro_batch=1, seed=1, workers=workers, int64=int64)
            batches = iter(loader)

            def rsd_python_step():
                nonlocal batches
                try:
                    b = next(batches)
                except StopIteration:
                    batches = iter(rsd.Loader(args.dir, micro_batch=1, seed=1, workers=workers, int64=int64))
                    b = next(batches)
                return b["input_ids"].numel()

            name = f"rsd (Python) {'int64' if int64 else 'int32'} w{workers}"
            results["readers"].append(timed(name, rsd_python_step, args.seconds))
            del loader, batches
    if args.pairs and not args.skip_rsd:
        # A shared VM's speed drifts by tens of percent within a minute: the Python/Rust ratio is
        # taken within pairs of back-to-back passes, not between medians taken minutes apart.
        for workers in map(int, args.workers.split(",")):
            ratios = []
            for _ in range(args.pairs):
                rust = next(r["tokens_per_s"] for r in rsd_bench(args, "--workers", str(workers), "--layout", "full",
                                                                 "--read", "pread", "--rounds", "1")
                            if r["what"] not in ("memcpy_limit", "sample_copies") and r["order"] == "shuffled")
                batches = iter(rsd.Loader(args.dir, micro_batch=1, seed=1, workers=workers, int64=False))
                next(batches)
                tokens, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < args.seconds:
                    tokens += next(batches)["input_ids"].numel()
                py = tokens / (time.perf_counter() - t0)
                del batches
                ratios.append((rust, py, py / rust))
            rec = {"reader": f"rsd (Python) int32 w{workers} vs rsd-loader full pread shuffled, interleaved",
                   "pairs": [{"rust_tokens_per_s": r, "python_tokens_per_s": p, "ratio": q} for r, p, q in ratios],
                   "median_ratio": sorted(q for _, _, q in ratios)[len(ratios) // 2]}
            results["readers"].append(rec)
            print(f"{'Python/Rust w' + str(workers) + ' interleaved':>28}: " + ", ".join(
                f"{p / 1e6:.0f}/{r / 1e6:.0f} ({100 * q:.0f}%)" for r, p, q in ratios)
                + f" M tok/s; median ratio {100 * rec['median_ratio']:.0f}%", flush=True)
    if args.rss_epochs:
        # RSS over whole epochs: sampled every 32 batches; flat means the loader frees what it read.
        samples, n = [], 0
        for b in rsd.Loader(args.dir, micro_batch=1, seed=1, epochs=args.rss_epochs):
            n += 1
            if n % 32 == 0:
                samples.append(rss_mib())
        rec = {"reader": "rsd (Python) RSS over epochs", "epochs": args.rss_epochs, "batches": n,
               "rss_first_mib": samples[0] if samples else None, "rss_max_mib": max(samples, default=None),
               "rss_last_mib": samples[-1] if samples else None}
        results["readers"].append(rec)
        print(f"{'rsd (Python) ' + str(args.rss_epochs) + ' epochs':>28}: {n} batches, RSS "
              f"{rec['rss_first_mib']:.0f} MiB after 32 → max {rec['rss_max_mib']:.0f} → last {rec['rss_last_mib']:.0f} MiB", flush=True)

    shards = manifest["shards"]

    # nanoGPT: np.memmap of one .bin, random windows, astype(int64) for x and y (recreated per batch as nanoGPT does).
    bin0 = args.dir / (shards[0]["prefix"] + ".bin")
    n_tok = shards[0]["tokens"]

    def nanogpt_step():
        data = np.memmap(bin0, dtype=dtype, mode="r")
        i = int(rng.integers(0, n_tok - L - 1))
        x = data[i:i + L].astype(np.int64)
        y = data[i + 1:i + 1 + L].astype(np.int64)
        return len(x) + 0 * len(y)

    np.asarray(np.memmap(bin0, dtype=dtype, mode="r")).sum()  # warm the page cache
    results["readers"].append(timed("nanoGPT np.memmap", nanogpt_step, args.seconds))

    # megatron-core IndexedDataset: a random sample = one Megatron document = its sequences.
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dss = [IndexedDataset(str(args.dir / s["prefix"])) for s in shards]

    def megatron_step():
        ds = dss[int(rng.integers(0, len(dss)))]
        docs = ds.document_indices
        k = int(rng.integers(0, len(docs) - 1))
        parts = [ds[j] for j in range(docs[k], docs[k + 1])]
        return len(np.concatenate(parts).astype(np.int64))

    results["readers"].append(timed("megatron-core IndexedDataset", megatron_step, args.seconds))

    # mosaicml-streaming: MDS written from the same samples, read with StreamingDataset(shuffle=True).
    from streaming import MDSWriter, StreamingDataset

    mds = args.dir.parent / (args.dir.name + "-mds")
    if not (mds / "index.json").exists():
        t0 = time.perf_counter()
        with MDSWriter(out=str(mds), columns={"input_ids": "ndarray:uint16" if dtype == np.uint16 else "ndarray:int32"},
                       size_limit=1 << 28) as w:
            written = 0
            for ds in dss:
                docs = ds.document_indices
                for k in range(len(docs) - 1):
                    w.write({"input_ids": np.concatenate([ds[j] for j in range(docs[k], docs[k + 1])])})
                    written += 1
                    if written >= args.mds_samples:
                        break
                if written >= args.mds_samples:
                    break
        print(f"wrote {written} samples as MDS to {mds} in {time.perf_counter() - t0:.1f}s", flush=True)
    sds = StreamingDataset(local=str(mds), shuffle=True, batch_size=1, shuffle_seed=1)
    it = iter(sds)
    for _ in range(min(len(sds), 256)):  # warm
        next(it)

    def streaming_step():
        nonlocal it
        try:
            s = next(it)
        except StopIteration:
            it = iter(sds)
            s = next(it)
        return len(np.asarray(s["input_ids"]).astype(np.int64))

    results["readers"].append(timed("mosaicml-streaming", streaming_step, args.seconds))
    results["peak_rss_mib_python"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
