"""How closely random-feature attention estimates softmax attention as the features grow.

For m in --features, the relative error ||performer(x) - mha(x)||_F / ||mha(x)||_F of
afterburner.nn.make_performer(mha, m) against the torch.nn.MultiheadAttention it was made from
(float64, eval, random weights, x ~ N(0, s^2) with s = --scale), averaged over --draws
projections, non-causal and causal. Prints the table and the log-log slope (theory: -1/2), and
writes the curve as an SVG (--svg).

  /usr/bin/python3 bench/rand_attention_error.py [--svg docs/rand_attention_error.svg]
"""
import argparse
import math

import torch

from afterburner import nn as abnn


def errors_for(mha, x, features, draws, causal):
    mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1]).double() if causal else None
    exact, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
    results = []
    for m in features:
        total = 0.0
        for seed in range(draws):
            performer = abnn.make_performer(mha, m, "softmax", causal, seed=seed).eval()
            total += (torch.linalg.norm(performer(x, x, x)[0] - exact) / torch.linalg.norm(exact)).item()
        results.append(total / draws)
    return results


def svg(curves, features, path):
    """A log-log plot of each curve (name -> errors over features), with a 1/sqrt(m) guide."""
    width, height, pad = 560, 360, 60
    all_errors = [e for errors in curves.values() for e in errors]
    x_lo, x_hi = math.log10(features[0]), math.log10(features[-1])
    y_lo, y_hi = math.log10(min(all_errors)) - 0.1, math.log10(max(all_errors)) + 0.1

    def point(m, e):
        px = pad + (math.log10(m) - x_lo) / (x_hi - x_lo) * (width - 2 * pad)
        py = height - pad - (math.log10(e) - y_lo) / (y_hi - y_lo) * (height - 2 * pad)
        return f"{px:.1f},{py:.1f}"

    colours = ["#1f77b4", "#d62728", "#2ca02c"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
             f'<text x="{width / 2}" y="20" text-anchor="middle">RandMultiHeadAttention vs exact attention: '
             f'relative error against features m</text>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>']
    for m in features:
        x, _ = point(m, 10 ** y_lo).split(",")
        parts.append(f'<text x="{x}" y="{height - pad + 16}" text-anchor="middle">{m}</text>')
    for exponent in range(math.floor(y_lo), math.ceil(y_hi) + 1):
        for mantissa in (1, 2, 5):
            value = mantissa * 10.0 ** exponent
            if y_lo <= math.log10(value) <= y_hi:
                _, y = point(features[0], value).split(",")
                parts.append(f'<text x="{pad - 6}" y="{y}" text-anchor="end">{value:g}</text>')
    first = next(iter(curves.values()))
    guide = [first[0] * math.sqrt(features[0] / m) for m in features]
    for index, (name, errors) in enumerate(list(curves.items()) + [("1/sqrt(m)", guide)]):
        colour = colours[index % len(colours)] if name != "1/sqrt(m)" else "#888888"
        dash = ' stroke-dasharray="4 4"' if name == "1/sqrt(m)" else ""
        points = " ".join(point(m, e) for m, e in zip(features, errors))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{width - pad - 120}" y="{pad + 16 * index}" fill="{colour}">{name}</text>')
    parts.append(f'<text x="{width / 2}" y="{height - 15}" text-anchor="middle">m (log scale)</text></svg>')
    with open(path, "w") as out:
        out.write("\n".join(parts) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", default="8,16,32,64,128,256,512,1024")
    parser.add_argument("--draws", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--embed", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--scale", type=float, default=0.5)
    parser.add_argument("--svg", default="")
    args = parser.parse_args()
    torch.manual_seed(0)
    features = [int(m) for m in args.features.split(",")]
    mha = torch.nn.MultiheadAttention(args.embed, args.heads, batch_first=True).double().eval()
    x = torch.randn(2, args.length, args.embed, dtype=torch.double) * args.scale
    curves = {}
    with torch.no_grad():
        for causal in (False, True):
            curves["causal" if causal else "non-causal"] = errors_for(mha, x, features, args.draws, causal)
    print(f"# embed {args.embed}, {args.heads} heads, L = {args.length}, x ~ N(0, {args.scale}^2), "
          f"mean of {args.draws} projections, float64")
    print(f"{'m':>6} " + " ".join(f"{name:>12}" for name in curves))
    for i, m in enumerate(features):
        print(f"{m:>6} " + " ".join(f"{errors[i]:>12.4f}" for errors in curves.values()))
    for name, errors in curves.items():
        slope = math.log(errors[-1] / errors[0]) / math.log(features[-1] / features[0])
        print(f"log-log slope, {name}: {slope:.3f} (1/sqrt(m): -0.5)")
    if args.svg:
        svg(curves, features, args.svg)
        print(f"wrote {args.svg}")


if __name__ == "__main__":
    main()
