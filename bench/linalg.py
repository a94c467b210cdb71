"""Randomized factorizations against LAPACK's exact ones on tall matrices, alternating in one process.

  randomized_svd(A, k)  vs  torch.linalg.svd(A, full_matrices=False) (the same k triplets taken)
  cqrrpt(A)             vs  torch.linalg.qr(A) (no pivoting) and scipy's geqp3 (pivoted) when installed
  cqrrpt(A, rank=k)     the rank-k pivoted QR, against the same SVD

A is m x n with a decaying spectrum (singular values 0.99^i), float64 and float32. Prints, per
method, the median [min, max] seconds over --reps alternating runs, the ratio to torch.linalg.svd,
and the accuracy each reached (rank k: ||A - U S V^T||_F or ||A[:, J] - Q R||_F over the best rank-k
error; QR: relative reconstruction and ||Q^T Q - I||_F).

  /usr/bin/python3 bench/linalg.py [--m 4096] [--n 1024] [--k 64] [--reps 5] [--threads 2]
"""
import argparse
import statistics
import time

import torch

import afterburner  # noqa: F401  (loads the ops)
from afterburner import linalg

try:
    import scipy.linalg as scipy_linalg
except ImportError:  # scipy is optional: the pivoted QR peer is skipped
    scipy_linalg = None


def decaying(m, n, dtype):
    torch.manual_seed(0)
    U = torch.linalg.qr(torch.randn(m, n, dtype=torch.double))[0]
    V = torch.linalg.qr(torch.randn(n, n, dtype=torch.double))[0]
    return ((U * 0.99 ** torch.arange(n, dtype=torch.double)) @ V.T).to(dtype)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=4096)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for dtype in (torch.float64, torch.float32):
        A = decaying(args.m, args.n, dtype)
        exact = torch.linalg.svdvals(A.double())
        best = exact[args.k:].square().sum().sqrt().item()
        methods = {
            "torch.linalg.svd": lambda: torch.linalg.svd(A, full_matrices=False),
            "randomized_svd": lambda: linalg.randomized_svd(A, args.k, seed=1),
            "torch.linalg.qr": lambda: torch.linalg.qr(A),
            "cqrrpt": lambda: linalg.cqrrpt(A, seed=1),
            f"cqrrpt rank {args.k}": lambda: linalg.cqrrpt(A, rank=args.k, seed=1),
        }
        if scipy_linalg is not None:
            array = A.numpy()
            methods["scipy qr(pivoting)"] = lambda: scipy_linalg.qr(array, mode="economic", pivoting=True)
        times = {name: [] for name in methods}
        results = {}
        for name, method in methods.items():
            results[name] = method()  # warm-up
        for _ in range(args.reps):
            for name, method in methods.items():
                start = time.perf_counter()
                method()
                times[name].append(time.perf_counter() - start)
        U, S, V = results["randomized_svd"]
        rsvd_error = (torch.linalg.norm(A.double() - (U * S).double() @ V.double().T) / best).item()
        Q, R, J = results["cqrrpt"]
        qr_error = (torch.linalg.norm(Q @ R - A[:, J]) / torch.linalg.norm(A)).item()
        orthogonality = torch.linalg.norm(Q.T @ Q - torch.eye(args.n, dtype=dtype)).item()
        Qk, Rk, Jk = results[f"cqrrpt rank {args.k}"]
        low_rank_error = (torch.linalg.norm((Qk @ Rk - A[:, Jk]).double()) / best).item()
        notes = {"randomized_svd": f"error {rsvd_error:.4f}x the best rank-{args.k}",
                 f"cqrrpt rank {args.k}": f"error {low_rank_error:.4f}x the best rank-{args.k}",
                 "cqrrpt": f"reconstruction {qr_error:.1e}, ||Q^T Q - I|| {orthogonality:.1e}"}
        svd = statistics.median(times["torch.linalg.svd"])
        print(f"# {args.m} x {args.n}, {dtype}, k = {args.k}, {args.threads} threads; "
              f"median [min, max] of {args.reps} alternating runs")
        for name, seconds in times.items():
            median = statistics.median(seconds)
            print(f"{name:>20} {median * 1000:9.1f} ms [{min(seconds) * 1000:.1f}, {max(seconds) * 1000:.1f}]"
                  f"  {svd / median:6.1f}x svd  {notes.get(name, '')}", flush=True)


if __name__ == "__main__":
    main()
