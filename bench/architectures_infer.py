#!/usr/bin/python3
"""Inference of real architectures at 3x224x224 (torchvision 0.14's, random weights):
`afterburner.optimize(model.eval(), dtype=...)` (the model frozen, BatchNorm folded, on oneDNN's
layouts: `afterburner optimize` and `serve`'s runtime, reached from Python) against Python
PyTorch's best practice on the same module, in one process, alternating; batch-1 latency and
batch-32 throughput; per model the medians, spread and the ratio round by round, then a table and
the geometric means.

    PYTHONPATH=build/python /usr/bin/python3 bench/architectures_infer.py [--reps 3] [--precision fp32]
        [--seconds 2] [--models resnet18,mobilenet_v3_small,efficientnet_b0,densenet121,convnext_tiny,vit_b_16]
        [--allocator tcmalloc|glibc|glibc-kept]

Besides torchvision's builders, --models takes the transformers of TOKEN_MODELS, written directly
with torch.nn (nn.TransformerEncoder of batch_first layers: in evaluation PyTorch runs each layer as
its fused fast path, aten::_transformer_encoder_layer_fwd; nn.MultiheadAttention with its defaults,
which runs its composed forward), on random token features.

Python's side is the faster, measured in each round, of
  frozen      torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.script(model))), float32
              (what PyTorch's performance guide recommends for CPU inference), for TOKEN_MODELS
  eager       the module itself (its layers take PyTorch's fused fast paths), and, for bf16,
  eager bf16  the module channels_last under torch.autocast("cpu", bfloat16) (1.13's frozen graphs
              do not run under autocast), LayerNorm inputs cast to float32 where 1.13's autocast
              fails on them (ConvNeXt, ViT).
Both sides take float32 images and return float32 logits; every call runs under
torch.inference_mode(), 2 intra-op threads. A round times each side for --seconds per batch size
after two warm-up calls (TorchScript's profiling runs), and reports the median call (batch 1) and
the samples/s over all calls (batch 32). The largest difference of each side's logits from the
eager module's, against their scale, is printed as a check (bf16 rounds: a few percent; 1.13's
optimize_for_inference computes hardswish on part of oneDNN's padded buffer only, so Python's
frozen MobileNetV3 is wrong by far more, and LibTorch warns of "resized" outputs).

Both sides share the process and so its memory allocator (--allocator, tcmalloc by default where
Debian's libtcmalloc-minimal4 is installed: the script runs itself again with it preloaded). On
glibc's default every large output is a fresh mapping, page-faulted anew at each call: Python's
frozen ResNet-18 took 1.9x as long per batch-32 call on it as on tcmalloc (about 7 us per 4 KB
page on these VMs), which hides the arithmetic both sides do.

Run it on a quiet machine: the load average is printed at start and end.
"""
import argparse
import copy
import math
import os
import statistics
import sys
import time

import torch
import torchvision

import afterburner
from architectures_train import ALLOCATORS, TCMALLOC, autocast_lacks_bf16_layer_norm, layer_norms_in_fp32
from machine import cpu_description, load_description

DEFAULT_MODELS = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "densenet121", "convnext_tiny", "vit_b_16")


def encoder(width, heads, hidden, activation, layers):
    layer = torch.nn.TransformerEncoderLayer(width, heads, hidden, activation=activation, batch_first=True)
    return torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class DefaultAttention(torch.nn.Module):
    """nn.MultiheadAttention with its defaults (sequence first, here with dropout 0.1): in
    evaluation PyTorch runs its composed forward (bmm, softmax, bmm), not the fast path."""

    def __init__(self, width, heads):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(width, heads, dropout=0.1)

    def forward(self, x):
        tokens = x.transpose(0, 1)
        return self.attention(tokens, tokens, tokens, need_weights=False)[0].transpose(0, 1)


# name -> (builder, one sample's shape): BERT-base's layers over 128 tokens, a small encoder, and
# one ViT-B-sized attention of MultiheadAttention's defaults over 197 tokens.
TOKEN_MODELS = {
    "bert_base_encoder": (lambda: encoder(768, 12, 3072, "gelu", 4), (128, 768)),
    "small_encoder": (lambda: encoder(256, 8, 1024, "relu", 4), (64, 256)),
    "default_attention": (lambda: DefaultAttention(768, 12), (197, 768)),
}
BATCH_SIZES = (1, 32)
THREADS = 2
WARMUP_CALLS = 2
ALLOCATOR_APPLIED = "AFTERBURNER_BENCH_ALLOCATOR"  # set once the script runs under --allocator


def timed_calls(function, batch, seconds):
    """Seconds of each call of function(batch), for at least `seconds` and 3 calls, after warm-up."""
    for _ in range(WARMUP_CALLS):
        function(batch)
    times = []
    deadline = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        function(batch)
        times.append(time.perf_counter() - start)
    return times


def figure(times, batch_size):
    """Batch 1: the median call's milliseconds (lower is better). Else samples/s over all calls."""
    if batch_size == 1:
        return statistics.median(times) * 1e3
    return batch_size * len(times) / sum(times)


def python_sides(model, precision, name):
    sides = {"frozen": torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.script(model)))}
    if name in TOKEN_MODELS:
        # Their eager forward takes PyTorch's fused fast paths too, and measured faster than the
        # frozen graph at batch 1 (BERT-base layers: 140-176 ms against 190-212).
        sides["eager"] = model
    if precision == "bf16":
        eager = copy.deepcopy(model).to(memory_format=torch.channels_last)
        if autocast_lacks_bf16_layer_norm():
            layer_norms_in_fp32(eager)

        def autocast(x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return eager(x.contiguous(memory_format=torch.channels_last)).float()

        sides["eager bf16"] = autocast
    return sides


def working(sides, batch):
    """The sides that answer `batch`; the others are named with their error and left out."""
    kept = {}
    for side, call in sides.items():
        try:
            with torch.inference_mode():
                call(batch)
            kept[side] = call
        except RuntimeError as error:
            print(f"  python {side} fails, left out: {str(error).strip().splitlines()[-1]}")
    return kept


def deviation(call, model, batch):
    """The largest difference of call(batch) from the eager module's answer, against its scale."""
    with torch.inference_mode():
        want = model(batch)
        got = call(batch)
    return (got - want).abs().max().item() / want.abs().max().item()


def built(name):
    """torchvision's model (or TOKEN_MODELS') with random weights, those it initialises to zero
    (ViT's head) drawn from N(0, 0.02), so that its logits differ from image to image and the check
    above means something."""
    torch.manual_seed(0)
    model = TOKEN_MODELS[name][0]() if name in TOKEN_MODELS else getattr(torchvision.models, name)(num_classes=1000)
    model = model.eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0, 0.02)
    return model


def compare_model(args, name):
    model = built(name)
    started = time.perf_counter()
    ours = afterburner.optimize(model, dtype=torch.bfloat16 if args.precision == "bf16" else None)
    print(f"{name}: afterburner.optimize took {time.perf_counter() - started:.1f} s")
    sample = TOKEN_MODELS[name][1] if name in TOKEN_MODELS else (3, 224, 224)
    batches = {b: torch.randn(b, *sample, generator=torch.Generator().manual_seed(b)) for b in BATCH_SIZES}
    theirs = working(python_sides(model, args.precision, name), batches[1])
    sides = {"afterburner": ours, **theirs}
    print("  logits' difference from the eager module's, against their scale: "
          + ", ".join(f"{side} {deviation(call, model, batches[32]):.1e}" for side, call in sides.items()))
    rounds = {b: [] for b in BATCH_SIZES}  # (afterburner, python's best, python's side) per round
    with torch.inference_mode():
        for round_index in range(args.reps):
            for b, batch in batches.items():
                mine = figure(timed_calls(ours, batch, args.seconds), b)
                python = {side: figure(timed_calls(call, batch, args.seconds), b) for side, call in theirs.items()}
                best = (min if b == 1 else max)(python, key=python.get)
                rounds[b].append((mine, python[best], best))
                unit = "ms" if b == 1 else "samples/s"
                others = ", ".join(f"{side} {value:.1f}" for side, value in python.items())
                print(f"  round {round_index + 1}, batch {b}: afterburner {mine:.1f} {unit}, python {others} "
                      f"-> {speedup(b, mine, python[best]):.2f}x")
    return {b: summarise(b, runs) for b, runs in rounds.items()}


def speedup(batch_size, ours, theirs):
    """How many times faster afterburner is: latency ratio at batch 1, throughput ratio otherwise."""
    return theirs / ours if batch_size == 1 else ours / theirs


def summarise(batch_size, runs):
    ratios = [speedup(batch_size, ours, theirs) for ours, theirs, _ in runs]
    return {"ours": [r[0] for r in runs], "theirs": [r[1] for r in runs], "ratio": statistics.median(ratios),
            "ratio_range": (min(ratios), max(ratios)), "python_side": statistics.mode(r[2] for r in runs)}


def spread(values):
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def print_table(args, results):
    print(f"\n{args.precision}, medians of {args.reps} rounds (min-max); ratio = how many times faster afterburner is")
    print(f"{'model':20s} | {'b1 ms: afterburner':>20s} | {'python':>20s} | {'ratio':>17s} | "
          f"{'b32 samples/s: afterburner':>26s} | {'python':>20s} | {'ratio':>17s}")
    for name, by_batch in results.items():
        cells = []
        for b in BATCH_SIZES:
            r = by_batch[b]
            low, high = r["ratio_range"]
            cells += [spread(r["ours"]), f"{spread(r['theirs'])} {r['python_side']}",
                      f"{r['ratio']:.2f}x ({low:.2f}-{high:.2f})"]
        print(f"{name:20s} | {cells[0]:>20s} | {cells[1]:>20s} | {cells[2]:>17s} | {cells[3]:>26s} | "
              f"{cells[4]:>20s} | {cells[5]:>17s}")
    for b in BATCH_SIZES:
        mean = math.exp(statistics.mean(math.log(r[b]["ratio"]) for r in results.values()))
        print(f"geometric mean at batch {b}: {mean:.2f}x over {len(results)} models")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="torchvision.models builders, or " + ", ".join(TOKEN_MODELS))
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="per side, batch size and round")
    parser.add_argument("--allocator", choices=tuple(ALLOCATORS), default="tcmalloc" if TCMALLOC.exists() else "glibc",
                        help="the process's memory allocator, both sides'")
    args = parser.parse_args()
    if args.allocator == "tcmalloc" and not TCMALLOC.exists():
        parser.error(f"--allocator tcmalloc: {TCMALLOC} is missing (Debian's libtcmalloc-minimal4)")
    if os.environ.get(ALLOCATOR_APPLIED) != args.allocator:
        env = {**os.environ, **ALLOCATORS[args.allocator], ALLOCATOR_APPLIED: args.allocator}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    torch.set_num_threads(THREADS)
    print(f"{cpu_description()}; torch {torch.__version__}, torchvision {torchvision.__version__}, {THREADS} threads, "
          f"allocator {args.allocator}; {load_description()}")
    results = {name: compare_model(args, name) for name in args.models.split(",") if name}
    print_table(args, results)
    print(f"at the end: {load_description()}")


if __name__ == "__main__":
    main()
