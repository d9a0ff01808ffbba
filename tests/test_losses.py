"""Tests of copynce_hf.modeling.losses_copynce against brute-force loops written from the paper's definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import free_port

from copynce_hf.modeling.errors import CopyNCEError
from copynce_hf.modeling.losses_copynce import (
    affinity_entropy,
    copy_bce_loss,
    copynce_loss,
    info_nce_loss,
    koleo_loss,
    paired_koleo_loss,
)

INF = float("inf")


# ----------------------------------------------------------------------------------------------
# Brute force, one scalar at a time, from the paper's equations
# ----------------------------------------------------------------------------------------------


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b) / (float(a.norm()) * float(b.norm()))


def _power(value: float, gamma: float, row_max: float) -> float:
    if value <= 0:
        return 0.0
    if gamma == 0:
        return 1.0
    if math.isinf(gamma):
        return 1.0 if value == row_max else 0.0
    return value**gamma


def _direction(za, zb, overlap, tau, gamma, weighting):
    """L^{#3}(a, b) for one pair; None when no patch of a overlaps b."""
    total, count, any_overlap = 0.0, 0, False
    for i in range(za.shape[0]):
        logits = [_cos(za[i], zb[j]) / tau for j in range(zb.shape[0])]
        log_z = math.log(sum(math.exp(s) for s in logits))
        row = [float(v) for v in overlap[i]]
        if weighting == "authors_code":
            nowhere = 1.0 - sum(row)
            columns = row + [nowhere if nowhere > 1e-5 else 0.0]
        else:
            columns = row
        if not any(v > 0 for v in row):
            if weighting == "authors_code":
                count += 1  # contributes zero, but counts in the mean over all patches
            continue
        any_overlap = True
        row_max = max(columns)
        powered = [_power(v, gamma, row_max) for v in columns]
        norm = sum(powered)
        loss_i = 0.0
        for j in range(zb.shape[0]):
            w = powered[j] / norm
            if w > 0:
                loss_i -= w * (logits[j] - log_z)
        total += loss_i
        count += 1
    return total / count if any_overlap else None


def brute_copynce(q, r, oqr, orq, tau=1 / 16, gamma=1.0, weighting="paper"):
    pair_losses = []
    for b in range(q.shape[0]):
        l_qr = _direction(q[b], r[b], oqr[b], tau, gamma, weighting)
        l_rq = _direction(r[b], q[b], orq[b], tau, gamma, weighting)
        if l_qr is not None and l_rq is not None:
            pair_losses.append(0.5 * (l_qr + l_rq))
    return sum(pair_losses) / len(pair_losses) if pair_losses else 0.0


def random_prior(generator, batch, la, lb, density=0.4, dtype=torch.float64):
    """Overlap-like priors: sparse rows of multiples of 1/16 summing to at most 1, some rows empty."""
    counts = torch.randint(0, 6, (batch, la, lb), generator=generator).to(dtype)
    counts = counts * (torch.rand(batch, la, lb, generator=generator) < density)
    counts[:, 0] = 0  # an untraced patch in every image
    totals = counts.sum(-1, keepdim=True)
    scale = torch.where(totals > 16, 16 / totals.clamp_min(1), torch.ones_like(totals))
    return torch.floor(counts * scale) / 16


@pytest.fixture
def case():
    g = torch.Generator().manual_seed(0)
    batch, lq, lr, c = 3, 5, 6, 7
    q = torch.randn(batch, lq, c, generator=g, dtype=torch.float64)
    r = torch.randn(batch, lr, c, generator=g, dtype=torch.float64)
    oqr = random_prior(g, batch, lq, lr)
    orq = random_prior(g, batch, lr, lq)
    assert (oqr.sum(-1) <= 1).all() and (oqr > 0).any()
    return q, r, oqr, orq


# ----------------------------------------------------------------------------------------------
# CopyNCE
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weighting", ["paper", "authors_code"])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 3.0, INF])
def test_copynce_matches_brute_force(case, gamma, weighting):
    q, r, oqr, orq = case
    expected = brute_copynce(q, r, oqr, orq, tau=1 / 16, gamma=gamma, weighting=weighting)
    got = copynce_loss(q, r, oqr, orq, temperature=1 / 16, gamma=gamma, weighting=weighting)
    assert got.dtype == torch.float64 and got.dim() == 0
    assert got.item() == pytest.approx(expected, rel=1e-10, abs=1e-12)


def test_authors_code_weighting_differs_from_paper_on_partly_traced_patches(case):
    q, r, oqr, orq = case
    paper = copynce_loss(q, r, oqr, orq, gamma=1.0)
    authors_code = copynce_loss(q, r, oqr, orq, gamma=1.0, weighting="authors_code")
    # Partly traced rows lose their untraced share and empty rows count as zeros.
    assert authors_code.item() < paper.item()
    # With fully traced rows and no empty rows, the nowhere column is empty and the two agree.
    full_qr = torch.eye(5, 6, dtype=torch.float64).expand(3, 5, 6).clone()
    full_rq = torch.eye(6, 5, dtype=torch.float64).expand(3, 6, 5).clone()
    full_rq[:, 5, 4] = 1.0
    assert copynce_loss(q, r, full_qr, full_rq, weighting="authors_code").item() == pytest.approx(
        copynce_loss(q, r, full_qr, full_rq).item(), rel=1e-12
    )


@pytest.mark.parametrize("gamma", [1.0, 3.0, 0.5])
def test_copynce_gradcheck(gamma):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    r = torch.randn(2, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    oqr = random_prior(g, 2, 3, 4, density=0.7)
    orq = random_prior(g, 2, 4, 3, density=0.7)
    for weighting in ("paper", "authors_code"):
        assert torch.autograd.gradcheck(
            lambda a, b, w=weighting: copynce_loss(a, b, oqr, orq, temperature=0.5, gamma=gamma, weighting=w),
            (q, r),
            fast_mode=True,
        )


def test_copynce_invariant_to_permuting_reference_patches(case):
    q, r, oqr, orq = case
    perm = torch.randperm(r.shape[1], generator=torch.Generator().manual_seed(3))
    assert not torch.equal(perm, torch.arange(r.shape[1]))
    for gamma in (0.0, 1.0, 3.0, INF):
        for weighting in ("paper", "authors_code"):
            base = copynce_loss(q, r, oqr, orq, gamma=gamma, weighting=weighting)
            permuted = copynce_loss(q, r[:, perm], oqr[:, :, perm], orq[:, perm], gamma=gamma, weighting=weighting)
            assert permuted.item() == pytest.approx(base.item(), rel=1e-12)
    # Permuting the tokens alone (prior left in place) changes the loss: the prior matters.
    assert copynce_loss(q, r[:, perm], oqr, orq).item() != pytest.approx(copynce_loss(q, r, oqr, orq).item())


def test_gamma_limits_are_exact():
    # One pair, one query patch, overlaps 0.5, 0.25, 0.25 with three reference patches.
    q = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    r = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]], dtype=torch.float64)
    oqr = torch.tensor([[[0.5, 0.25, 0.25]]], dtype=torch.float64)
    orq = torch.tensor([[[1.0], [0.0], [0.0]]], dtype=torch.float64)
    tau = 0.5
    log_p = torch.log_softmax(torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64) / tau, 0)
    l_rq = 0.0  # reference patch 0 -> the only query patch: log p = 0
    uniform = -(log_p.sum() / 3)
    one_hot = -log_p[0]
    assert copynce_loss(q, r, oqr, orq, temperature=tau, gamma=0.0).item() == pytest.approx(
        0.5 * (uniform.item() + l_rq), rel=1e-14
    )
    assert copynce_loss(q, r, oqr, orq, temperature=tau, gamma=INF).item() == pytest.approx(
        0.5 * (one_hot.item() + l_rq), rel=1e-14
    )
    # Large finite gamma approaches the one-hot limit when the maximum is unique ...
    near = copynce_loss(q, r, oqr, orq, temperature=tau, gamma=50.0).item()
    assert near == pytest.approx(0.5 * one_hot.item(), rel=1e-12)
    # ... and a tie at the maximum makes the inf limit uniform over the tied patches.
    tied = torch.tensor([[[0.4, 0.4, 0.2]]], dtype=torch.float64)
    assert copynce_loss(q, r, tied, orq, temperature=tau, gamma=INF).item() == pytest.approx(
        0.5 * (-(log_p[0] + log_p[1]) / 2).item(), rel=1e-14
    )


def test_large_gamma_on_small_overlaps_does_not_underflow():
    # Overlaps of 1/256 to the power 50 underflow float32; the row-max normalisation avoids it.
    q = torch.randn(1, 2, 4)
    r = torch.randn(1, 3, 4)
    oqr = torch.tensor([[[2 / 256, 1 / 256, 0.0], [0.0, 0.0, 1 / 256]]])
    orq = torch.tensor([[[1 / 256, 0.0], [0.0, 0.0], [0.0, 3 / 256]]])
    big = copynce_loss(q, r, oqr, orq, gamma=50.0)
    inf = copynce_loss(q, r, oqr, orq, gamma=INF)
    assert torch.isfinite(big) and big.item() == pytest.approx(inf.item(), rel=1e-5)


def test_zero_overlap_gives_finite_gradients_for_fractional_gamma():
    q = torch.randn(2, 4, 8, requires_grad=True)
    r = torch.randn(2, 4, 8, requires_grad=True)
    oqr = torch.zeros(2, 4, 4)
    oqr[:, 1, 2] = 0.75
    orq = oqr.transpose(1, 2).clone()
    for gamma in (0.0, 0.3, 1.0, INF):
        loss = copynce_loss(q, r, oqr, orq, gamma=gamma)
        q.grad = r.grad = None
        loss.backward()
        assert torch.isfinite(loss)
        assert torch.isfinite(q.grad).all() and torch.isfinite(r.grad).all()
        assert q.grad.abs().sum() > 0


def test_batch_without_overlap_is_zero_with_gradient_path():
    q = torch.randn(3, 4, 8, requires_grad=True)
    r = torch.randn(3, 5, 8, requires_grad=True)
    loss = copynce_loss(q, r, torch.zeros(3, 4, 5), torch.zeros(3, 5, 4))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert q.grad is not None and r.grad is not None
    assert torch.count_nonzero(q.grad) == 0 and torch.count_nonzero(r.grad) == 0


def test_pairs_with_overlap_in_one_direction_only_are_excluded(case):
    q, r, oqr, orq = case
    oqr, orq = oqr.clone(), orq.clone()
    orq[0] = 0  # pair 0: overlap q->r but none r->q
    assert (oqr[0] > 0).any()
    expected = copynce_loss(q[1:], r[1:], oqr[1:], orq[1:])
    assert copynce_loss(q, r, oqr, orq).item() == pytest.approx(expected.item(), rel=1e-12)
    assert copynce_loss(q, r, oqr, orq).item() == pytest.approx(brute_copynce(q, r, oqr, orq), rel=1e-10)
    # pair_mask removes pairs on top of that.
    mask = torch.tensor([True, True, False])
    assert copynce_loss(q, r, oqr, orq, pair_mask=mask).item() == pytest.approx(
        copynce_loss(q[1:2], r[1:2], oqr[1:2], orq[1:2]).item(), rel=1e-12
    )


def test_copynce_low_precision_tokens_are_finite():
    q = torch.randn(2, 16, 32).to(torch.bfloat16).requires_grad_()
    r = torch.randn(2, 16, 32).to(torch.bfloat16).requires_grad_()
    oqr = torch.eye(16).expand(2, 16, 16).contiguous()
    loss = copynce_loss(q, r, oqr, oqr.transpose(1, 2), gamma=3.0)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(q.grad.float()).all()


def test_copynce_rejects_bad_inputs(case):
    q, r, oqr, orq = case
    with pytest.raises(CopyNCEError, match="overlap_rq"):
        copynce_loss(q, r, oqr, oqr)
    with pytest.raises(CopyNCEError, match="does not match"):
        copynce_loss(q, r, orq.transpose(1, 2)[:, :, :4], orq)
    with pytest.raises(CopyNCEError, match="gamma"):
        copynce_loss(q, r, oqr, orq, gamma=-1.0)
    with pytest.raises(CopyNCEError, match="weighting"):
        copynce_loss(q, r, oqr, orq, weighting="average")
    with pytest.raises(CopyNCEError, match="temperature"):
        copynce_loss(q, r, oqr, orq, temperature=0.0)


# ----------------------------------------------------------------------------------------------
# InfoNCE, KoLeo, BCE, affinity entropy
# ----------------------------------------------------------------------------------------------


def _unit(generator, *shape):
    return F.normalize(torch.randn(*shape, generator=generator, dtype=torch.float64), dim=-1)


def test_info_nce_matches_hand_formula():
    g = torch.Generator().manual_seed(4)
    q, r = _unit(g, 5, 6), _unit(g, 5, 6)
    scale = math.exp(3.2)
    expected = 0.0
    for b in range(5):
        row_q = [scale * float(q[b] @ r[c]) for c in range(5)]
        row_r = [scale * float(r[b] @ q[c]) for c in range(5)]
        expected += -(row_q[b] - math.log(sum(math.exp(v) for v in row_q)))
        expected += -(row_r[b] - math.log(sum(math.exp(v) for v in row_r)))
    expected /= 2 * 5
    logit_scale = torch.tensor(3.2, dtype=torch.float64, requires_grad=True)
    loss = info_nce_loss(q, r, logit_scale)
    assert loss.item() == pytest.approx(expected, rel=1e-10)
    loss.backward()
    assert logit_scale.grad is not None and logit_scale.grad != 0
    # The scale is clamped at 100: beyond it the loss no longer changes.
    assert info_nce_loss(q, r, 6.0).item() == pytest.approx(info_nce_loss(q, r, math.log(100.0)).item())
    # max_scale=None (the authors' code): unbounded, exp(6) = 403 is used as it is.
    scale = math.exp(6.0)
    unbounded = sum(
        -(scale * float(a[b] @ c[b]) - math.log(sum(math.exp(scale * float(a[b] @ c[k])) for k in range(5))))
        for a, c in ((q, r), (r, q)) for b in range(5)) / 10
    assert info_nce_loss(q, r, 6.0, max_scale=None).item() == pytest.approx(unbounded, rel=1e-10)


def test_sscd_info_nce_over_all_embeddings_matches_brute_force():
    g = torch.Generator().manual_seed(14)
    q, r = _unit(g, 4, 6), _unit(g, 4, 6)
    scale = math.exp(3.2)
    embeddings = torch.cat([q, r])  # 2N: every one an anchor, its partner the positive, itself excluded
    expected = 0.0
    for i in range(8):
        partner = (i + 4) % 8
        logits = [scale * float(embeddings[i] @ embeddings[j]) for j in range(8) if j != i]
        positive = scale * float(embeddings[i] @ embeddings[partner])
        expected += -(positive - math.log(sum(math.exp(v) for v in logits)))
    expected /= 8
    assert info_nce_loss(q, r, 3.2, negatives="all_embeddings").item() == pytest.approx(expected, rel=1e-10)
    with pytest.raises(CopyNCEError, match="negatives"):
        info_nce_loss(q, r, 3.2, negatives="both")


def test_paired_koleo_excludes_itself_and_its_partner():
    g = torch.Generator().manual_seed(15)
    q = torch.randn(5, 4, generator=g, dtype=torch.float64)
    r = q + 0.01 * torch.randn(5, 4, generator=g, dtype=torch.float64)  # partners are the nearest: excluded
    unit = F.normalize(torch.cat([q, r]), dim=-1).numpy()
    expected = 0.0
    for i in range(10):
        others = [np.linalg.norm(unit[i] - unit[j]) for j in range(10) if j not in (i, (i + 5) % 10)]
        expected += -math.log(min(others) + 1e-8)
    expected /= 10
    assert paired_koleo_loss(q, r).item() == pytest.approx(expected, rel=1e-10)
    single = paired_koleo_loss(q[:1].requires_grad_(), r[:1])
    assert single.item() == 0.0
    single.backward()


def test_koleo_matches_hand_formula():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    unit = (x / x.norm(dim=1, keepdim=True)).numpy()
    distances = np.linalg.norm(unit[:, None] - unit[None], axis=-1)
    np.fill_diagonal(distances, np.inf)
    expected = -np.mean(np.log(distances.min(axis=1) + 1e-8))
    assert koleo_loss(x).item() == pytest.approx(expected, rel=1e-10)
    # Spreading apart lowers the loss: antipodal pairs beat a cluster.
    cluster = F.normalize(torch.ones(4, 3) + 0.01 * torch.randn(4, 3, generator=torch.Generator().manual_seed(0)))
    spread = torch.tensor([[1.0, 0, 0], [-1.0, 0, 0], [0, 1.0, 0], [0, -1.0, 0]])
    assert koleo_loss(spread) < koleo_loss(cluster)
    with pytest.raises(CopyNCEError, match="B >= 2"):
        koleo_loss(torch.randn(1, 3))


def test_koleo_gradient_is_finite_with_duplicates():
    x = torch.randn(3, 4)
    x = torch.cat([x, x[:1]]).requires_grad_()
    koleo_loss(x).backward()
    assert torch.isfinite(x.grad).all()


def test_copy_bce_matches_hand_formula():
    logits = torch.tensor([2.0, -1.0, 0.5, 0.0], dtype=torch.float64)
    labels = torch.tensor([1, 0, 0, 1])
    sig = torch.sigmoid(logits)
    expected = -(labels * sig.log() + (1 - labels) * (1 - sig).log()).mean()
    assert copy_bce_loss(logits, labels).item() == pytest.approx(expected.item(), rel=1e-12)
    with pytest.raises(CopyNCEError, match="shape"):
        copy_bce_loss(logits, labels[:3])


def test_affinity_entropy_matches_hand_formula_and_bounds():
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    r = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    entropy = affinity_entropy(q, r, temperature=0.25)
    assert entropy.shape == (2, 3)
    for b in range(2):
        for i in range(3):
            s = [_cos(q[b, i], r[b, j]) / 0.25 for j in range(4)]
            z = sum(math.exp(v) for v in s)
            p = [math.exp(v) / z for v in s]
            assert entropy[b, i].item() == pytest.approx(-sum(pi * math.log(pi) for pi in p), rel=1e-10)
    assert (entropy >= 0).all() and (entropy <= math.log(4) + 1e-12).all()
    # Identical reference tokens give the uniform distribution: maximal entropy log(Lr).
    same = r[:, :1].expand(2, 4, 5)
    assert torch.allclose(affinity_entropy(q, same), torch.full((2, 3), math.log(4), dtype=torch.float64))


# ----------------------------------------------------------------------------------------------
# InfoNCE over two processes (gloo): the gathered negatives reproduce the global-batch loss
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_info_nce_gathers_negatives_across_processes(tmp_path):
    """Both InfoNCE forms and the paired KoLeo over two gloo processes equal the single-process global values."""
    import torch.multiprocessing as mp
    from _infonce_worker import CONSTANT_GATHER_FORMS, FORMS, distributed_worker

    g = torch.Generator().manual_seed(7)
    q, r = _unit(g, 6, 4), _unit(g, 6, 4)
    mp.start_processes(distributed_worker, args=(2, free_port(), q, r, str(tmp_path)), nprocs=2,
                       join=True, start_method="spawn")
    saved = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    for form in FORMS:
        _check_gathered(q, r, form, [ranks[form] for ranks in saved])
    for form in CONSTANT_GATHER_FORMS:
        plain = {"all_embeddings_constant_gather": "all_embeddings"}.get(form, "paired_koleo")
        _check_constant_gather(q, r, form, [ranks[form] for ranks in saved], [ranks[plain] for ranks in saved])


def _authors_infonce(local: torch.Tensor, others: torch.Tensor, scale: float) -> torch.Tensor:
    """The authors' ``infonce_loss(features, positive_indices, scale, gather=True)`` written out: the
    local ``2B`` features (queries then references) first, the other process's after, as constants;
    the diagonal's cosine set to -1; each local row's positive is its partner."""
    features = F.normalize(torch.cat([local, others.detach()]), dim=1)
    cosines = features @ features.T
    cosines = cosines - torch.diag(torch.diagonal(cosines) + 1)  # diagonal -> -1
    n = local.shape[0]
    positives = torch.cat([torch.arange(n // 2, n), torch.arange(n // 2)])
    probabilities = F.softmax(scale * cosines[:n], dim=-1)
    return -torch.log(probabilities[torch.arange(n), positives]).mean()


def _authors_koleo(local: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    """The authors' ``koleo_loss(features, labels, gather=True)`` written out (partner excluded)."""
    n = local.shape[0]
    features = F.normalize(local, dim=1)
    everything = F.normalize(torch.cat([local, others.detach()]), dim=1)
    cosines = features @ everything.T
    partner = torch.cat([torch.arange(n // 2, n), torch.arange(n // 2)])
    excluded = torch.zeros_like(cosines, dtype=torch.bool)
    excluded[torch.arange(n), torch.arange(n)] = True
    excluded[torch.arange(n), partner] = True
    closest = cosines.masked_fill(excluded, -1).max(dim=1).values
    return -(2 - 2 * closest).clamp(min=1e-6).sqrt().log().mean()


def _check_constant_gather(q, r, form, results, full):
    # Gathered as constants (the authors' all_gather): each process's loss is their formula on its own
    # rows with the other process's rows as constants, so its gradient holds only its own loss's terms.
    batch = q.shape[0] // 2
    global_loss = (info_nce_loss(q, r, 3.2, negatives="all_embeddings") if form.startswith("all_embeddings")
                   else paired_koleo_loss(q, r))
    assert ((results[0][0] + results[1][0]) / 2).item() == pytest.approx(global_loss.item(), rel=1e-6)
    for rank in range(2):
        own = slice(rank * batch, (rank + 1) * batch)
        other = slice((1 - rank) * batch, (2 - rank) * batch)
        local = torch.cat([q[own], r[own]]).clone().requires_grad_()
        others = torch.cat([q[other], r[other]])
        expected = (_authors_infonce(local, others, math.exp(3.2)) if form.startswith("all_embeddings")
                    else _authors_koleo(local, others))
        expected.backward()
        assert results[rank][0].item() == pytest.approx(expected.item(), rel=1e-6)
        # Their formula normalises its unit-norm inputs again, which removes the gradient's radial part
        # (the model's descriptors are normalised before the loss, so only the tangent part reaches it).
        ours = torch.cat([results[rank][1], results[rank][2]])
        assert torch.allclose(_tangent(ours, local.detach()), _tangent(local.grad, local.detach()), atol=1e-8)
        # The other process's terms are missing: the gradient differs from the one gathered with gradients.
        with_gradients = torch.cat([full[rank][1], full[rank][2]])
        assert not torch.allclose(_tangent(ours, local.detach()), _tangent(with_gradients, local.detach()), atol=1e-4)


def _tangent(gradient: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """The part of ``gradient`` (rows) orthogonal to the unit rows ``unit``."""
    return gradient - (gradient * unit).sum(dim=1, keepdim=True) * unit


def _check_gathered(q, r, form, results):
    # Each process averages over its own rows; DDP averages the processes: the mean of the two
    # losses (and the sum of the gradients over processes / 2) is the single-process global loss.
    global_q = q.clone().requires_grad_()
    global_r = r.clone().requires_grad_()
    if form == "paired_koleo":
        global_loss = paired_koleo_loss(global_q, global_r)
    else:
        global_loss = info_nce_loss(global_q, global_r, 3.2, negatives=form)
    global_loss.backward()
    mean_loss = (results[0][0] + results[1][0]) / 2
    assert mean_loss.item() == pytest.approx(global_loss.item(), rel=1e-10)
    # Gradients flow through the gather: each rank's local grads (own rows' terms plus the terms
    # where its rows act as negatives for the other rank, summed by the backward all-reduce)
    # halved equal the global gradient's rows.
    local_q_grads = torch.cat([results[0][1], results[1][1]]) / 2
    local_r_grads = torch.cat([results[0][2], results[1][2]]) / 2
    assert torch.allclose(local_q_grads, global_q.grad, atol=1e-10)
    assert torch.allclose(local_r_grads, global_r.grad, atol=1e-10)
