"""Random-feature attention against exact attention, time and memory, as the sequence grows.

Three layers of the same sizes on the same batch-first input (self-attention, fp32):
  mha        torch.nn.MultiheadAttention (batch_first; in inference its fused fast path,
             need_weights=False), PyTorch's own;
  exact      the same projections around afterburner's fused exact attention (tiled, online
             softmax: no [L, L] matrix kept), afterburner.nn.functional.attention;
  performer  afterburner.nn.RandMultiHeadAttention (FAVOR+, num_random_features m).
Each (layer, length) runs in a process of its own, so that its peak memory is its own: the median
time of at least --iters calls and a second of them after two warm-ups, and the growth of the peak RSS over the process's RSS
before the first call (inputs and weights excluded). The layers alternate within each
repetition; the table gives the median [min, max] over repetitions and each layer's ratio to
mha. Where mha's [H, L, L] scores would not fit in --max-gib, it is not run.

With --causal every layer is causal: mha with generate_square_subsequent_mask's float mask (its
fast path then falls back to the math path, as it does for users' causal masks), exact with
causal=True, the performer with iscausal=True (prefix states over blocks of 128 positions).

  /usr/bin/python3 bench/rand_attention.py [--lengths 256,1024,4096,16384] [--embed 256] [--heads 4]
      [--features 128] [--mode inference|training] [--causal] [--reps 3] [--iters 5] [--threads 2]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LAYERS = ("mha", "exact", "performer")


def rss_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def make_layer(kind, args):
    import torch
    import afterburner
    from afterburner import nn as abnn

    torch.manual_seed(0)
    if kind == "performer":
        return abnn.RandMultiHeadAttention(args.embed, args.heads, args.features, seed=0, iscausal=args.causal)
    mha = torch.nn.MultiheadAttention(args.embed, args.heads, batch_first=True)
    if kind == "mha":
        return mha

    class Exact(torch.nn.Module):
        """MultiheadAttention's projections around afterburner's fused attention."""

        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, query, key, value):
            b, length, e = query.shape
            h = args.heads
            q, k, v = torch.nn.functional.linear(query, self.mha.in_proj_weight, self.mha.in_proj_bias).chunk(3, -1)
            split = lambda t: t.view(b, length, h, e // h).transpose(1, 2)  # noqa: E731
            out = afterburner.nn.functional.attention(split(q), split(k), split(v), is_causal=args.causal)
            return self.mha.out_proj(out.transpose(1, 2).reshape(b, length, e)), None

    return Exact()


def run_one(kind, length, args):
    """One layer at one length in this process: {"seconds": median, "peak_mib": growth}."""
    import torch

    torch.set_num_threads(args.threads)
    layer = make_layer(kind, args)
    x = torch.randn(1, length, args.embed, requires_grad=args.mode == "training")
    training = args.mode == "training"
    layer.train(training)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(length) if args.causal and kind == "mha" else None
    masked = {"attn_mask": mask} if mask is not None else {}

    def call():
        if training:
            out = layer(x, x, x, **masked)[0]
            out.sum().backward()
            return
        with torch.no_grad():
            if kind == "mha":
                layer(x, x, x, need_weights=False, **masked)
            else:
                layer(x, x, x)

    before = rss_mib()
    call()  # warm-ups: the first calls set up threads and caches
    call()
    times = []
    while len(times) < args.iters or sum(times) < 1.0:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": statistics.median(times), "peak_mib": peak - before}


def mha_scores_gib(length, args):
    copies = 4 if args.mode == "training" else 2  # scores and probabilities (and their gradients)
    return copies * args.heads * length * length * 4 / 2**30


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="256,1024,4096,16384")
    parser.add_argument("--embed", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--mode", choices=("inference", "training"), default="inference")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-gib", type=float, default=12.0)
    parser.add_argument("--one", nargs=2, metavar=("LAYER", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]), args)))
        return
    passed = [a for a in sys.argv[1:]]
    print(f"# {args.mode}{', causal' if args.causal else ''}, batch 1, embed {args.embed}, {args.heads} heads, m = {args.features}, "
          f"{args.threads} threads, fp32; median [min, max] of {args.reps} alternating runs of {args.iters} calls")
    print(f"{'L':>6} {'layer':>10} {'ms':>24} {'peak MiB':>10} {'vs mha':>8}")
    for length in (int(n) for n in args.lengths.split(",")):
        layers = [k for k in LAYERS if k != "mha" or mha_scores_gib(length, args) <= args.max_gib]
        results = {k: [] for k in layers}
        for _ in range(args.reps):
            for kind in layers:
                out = subprocess.run([sys.executable, __file__, *passed, "--one", kind, str(length)], check=True,
                                     capture_output=True, text=True).stdout
                results[kind].append(json.loads(out.strip().splitlines()[-1]))
        mha = statistics.median(r["seconds"] for r in results["mha"]) if "mha" in results else None
        for kind in LAYERS:
            if kind not in results:
                print(f"{length:>6} {kind:>10}   not run: its scores need {mha_scores_gib(length, args):.1f} GiB")
                continue
            seconds = [r["seconds"] * 1000 for r in results[kind]]
            median = statistics.median(seconds)
            peak = statistics.median(r["peak_mib"] for r in results[kind])
            ratio = f"{mha / (median / 1000):.2f}x" if mha else "-"
            print(f"{length:>6} {kind:>10} {median:>9.1f} [{min(seconds):.1f}, {max(seconds):.1f}] "
                  f"{peak:>10.0f} {ratio:>8}", flush=True)


if __name__ == "__main__":
    main()
