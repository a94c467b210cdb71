"""Randomized factorizations with Panther's signatures (panther.linalg), on LAPACK.

    from afterburner import linalg
    U, S, V = linalg.randomized_svd(A, k=64)            # A ~ U @ torch.diag(S) @ V.T
    Q, R, J = linalg.cqrrpt(M)                         # M[:, J] == Q @ R, M tall
    Q, R, J = linalg.cqrrpt(M, rank=64)                # M[:, J] ~ Q @ R of rank 64
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ["randomized_svd", "cqrrpt"]


def randomized_svd(A: Tensor, k: int, tol: float = 0.0, block_size: int = 64, oversampling: int = 10,
                   power_iterations: int = 2, seed: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """The leading k singular triplets of A [m, n]: U [m, r], S [r] (descending), V [n, r], r <= k.

    A randomized range finder grown block by block (Gaussian test matrices, `power_iterations`
    subspace iterations per block), stopped at rank k + oversampling or once
    ||A - Q Q^T A||_F <= tol ||A||_F, then the SVD of the small Q^T A. float32 or float64.
    """
    return torch.ops.afterburner.randomized_svd(A, k, tol, block_size, oversampling, power_iterations, seed)


def cqrrpt(M: Tensor, gamma: float = 1.25, sketch: str = "sjlt", rank: Optional[int] = None,
           seed: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """CholeskyQR with randomization and pivoting: Q [m, k], R [k, n] upper triangular and the column
    order J [n] with M[:, J] = Q @ R, for a tall M [m, n].

    The pivots come from the QR with column pivoting of a sketch S M (ceil(gamma k) rows; sketch
    "sjlt", "count", "gaussian", "sign" or "srht"), then one Cholesky QR of M[:, J_k] R_11^-1.
    k is M's numerical rank as the sketch reveals it, at most `rank` (None: n, a whole QR); below
    n, Q @ R is the rank-k approximation of M[:, J].
    """
    return torch.ops.afterburner.cqrrpt(M, gamma, sketch, rank, seed)
