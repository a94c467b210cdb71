"""afterburner.linalg against torch.linalg, as Panther's tests check panther.linalg: reconstruction and
orthonormality below 1e-9 in double, singular values against the exact SVD, float32, TorchScript."""
import pytest
import torch

from afterburner import linalg


def low_rank(m, n, singular_values):
    U = torch.linalg.qr(torch.randn(m, len(singular_values), dtype=torch.double))[0]
    V = torch.linalg.qr(torch.randn(n, len(singular_values), dtype=torch.double))[0]
    return (U * singular_values) @ V.T


def orthonormality(Q):
    return torch.linalg.norm(Q.T @ Q - torch.eye(Q.shape[1], dtype=Q.dtype)).item()


@pytest.mark.parametrize("m,n,k", [(500, 100, 10), (100, 500, 25), (64, 64, 64)])
def test_randomized_svd_recovers_low_rank_matrices_as_panther_checks(m, n, k):
    torch.manual_seed(0)
    singular_values = torch.linspace(20, 1, k, dtype=torch.double)
    A = low_rank(m, n, singular_values)
    U, S, V = linalg.randomized_svd(A, k, 1e-12)
    assert U.shape == (m, k) and S.shape == (k,) and V.shape == (n, k)
    assert torch.linalg.norm(U @ torch.diag(S) @ V.T - A) / torch.linalg.norm(A) < 1e-9
    assert orthonormality(U) < 1e-9 and orthonormality(V) < 1e-9
    torch.testing.assert_close(S, torch.linalg.svdvals(A)[:k], rtol=1e-9, atol=0)


def test_randomized_svd_error_against_the_exact_svd():
    torch.manual_seed(1)
    A = torch.randn(2000, 300, dtype=torch.double) @ torch.diag(0.95 ** torch.arange(300, dtype=torch.double))
    k = 40
    U, S, V = linalg.randomized_svd(A, k, seed=3)
    exact = torch.linalg.svdvals(A)
    best = exact[k:].square().sum().sqrt()
    assert torch.linalg.norm(A - U @ torch.diag(S) @ V.T) <= 1.02 * best
    # The leading values converge first; those near k keep the power iterations' error.
    torch.testing.assert_close(S[:20], exact[:20], rtol=1e-4, atol=0)
    torch.testing.assert_close(S, exact[:k], rtol=1e-2, atol=0)
    again = linalg.randomized_svd(A, k, seed=3)
    assert torch.equal(again[1], S), "the same seed, the same answer"


@pytest.mark.parametrize("sketch", ["sjlt", "gaussian", "srht"])
def test_cqrrpt_factors_a_permuted_tall_matrix(sketch):
    torch.manual_seed(2)
    M = low_rank(2000, 120, torch.logspace(0, -6, 120, dtype=torch.double))
    before = M.clone()
    Q, R, J = linalg.cqrrpt(M, 1.25, sketch)
    assert Q.shape == (2000, 120) and R.shape == (120, 120) and J.shape == (120,)
    assert torch.linalg.norm(Q @ R - M[:, J]) / torch.linalg.norm(M) < 1e-9
    assert orthonormality(Q) < 1e-9
    assert torch.equal(R, torch.triu(R)) and torch.equal(J.sort().values, torch.arange(120))
    assert torch.equal(M, before)


def test_float32_and_torchscript():
    torch.manual_seed(3)
    M = torch.randn(300, 40)
    Q, R, J = torch.jit.script(linalg.cqrrpt)(M)
    assert Q.dtype == torch.float32
    assert torch.linalg.norm(Q @ R - M[:, J]) / torch.linalg.norm(M) < 1e-5
    U, S, V = linalg.randomized_svd(M, 5)
    torch.testing.assert_close(S, torch.linalg.svdvals(M)[:5], rtol=0.05, atol=0)


def test_bad_arguments_are_one_clear_error():
    with pytest.raises(RuntimeError, match="randomized_svd k"):
        linalg.randomized_svd(torch.randn(10, 5), 6)
    with pytest.raises(RuntimeError, match="tall matrix"):
        linalg.cqrrpt(torch.randn(5, 10))
    with pytest.raises(RuntimeError, match="sketch"):
        linalg.cqrrpt(torch.randn(50, 10), sketch="fourier")
