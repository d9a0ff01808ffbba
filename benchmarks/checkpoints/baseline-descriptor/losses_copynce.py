"""Training objectives of the CopyNCE descriptor and matcher.

Notation follows the paper (section "CopyNCE Loss"): query tokens ``z^q_i`` and reference
tokens ``z^r_j`` of one copy pair, the token affinity ``s_ij = cos(z^q_i, z^r_j) / tau`` and
its softmax over the reference patches ``p_ij`` (the noise set is every patch of the
reference image, ``R^X = R^R``), and the PixTrace overlap prior ``q-hat_ij`` (fraction of
the pixels of query patch ``i`` that land in reference patch ``j``, as produced by
:func:`copynce_hf.pixtrace.patch_overlap`).

* :func:`copynce_loss` -- the symmetric CopyNCE loss (paper equations "CopyNCE #3" and
  "CopyNCE", with the confidence sharpening ``gamma``).
* :func:`info_nce_loss` -- the descriptor's InfoNCE baseline (CPC), symmetric, with
  negatives gathered over all processes.
* :func:`koleo_loss` -- the KoLeo spreading regulariser (Sablayrolles et al. 2018).
* :func:`paired_koleo_loss` -- KoLeo over the query and reference descriptors of all processes
  together, each descriptor's own partner excluded (the authors' form).
* :func:`copy_bce_loss` -- the matcher's binary cross-entropy baseline.
* :func:`affinity_entropy` -- the paper's affinity entropy ``E_i`` (section
  "Visualization and Interpretability").

Every function is a pure function of tensors: models call them in ``forward`` and any
training loop can call them directly.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .errors import ConfigError, ShapeError

__all__ = [
    "affinity_entropy",
    "copy_bce_loss",
    "copynce_loss",
    "info_nce_loss",
    "koleo_loss",
    "overlap_target",
    "paired_koleo_loss",
    "token_affinity_logits",
]

# Rows of an overlap prior sum to at most 1; the "nowhere" share of a row, 1 - sum, is
# treated as zero below this value (float rounding of sums of multiples of 1/patch_size**2).
_NOWHERE_TOLERANCE = 1e-5

WEIGHTINGS = ("paper", "authors_code")
#: Pairs the batch loss of CopyNCE is averaged over.
AVERAGES = ("overlap_pairs", "all_pairs")
#: InfoNCE negatives: the other view's descriptors only, or every other descriptor of the batch (SSCD).
INFONCE_NEGATIVES = ("cross_view", "all_embeddings")


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float32 for half/bfloat16 inputs (softmax over hundreds of patches), else the input's dtype."""
    return torch.promote_types(tensor.dtype, torch.float32)


def token_affinity_logits(
    query_tokens: torch.Tensor, reference_tokens: torch.Tensor, temperature: float = 1 / 16
) -> torch.Tensor:
    """Scaled cosine similarities ``s_ij = cos(z^q_i, z^r_j) / tau`` of the tokens of each pair.

    Args:
        query_tokens: (B, Lq, C).
        reference_tokens: (B, Lr, C).
        temperature: ``tau`` (paper default 1/16).

    Returns:
        (B, Lq, Lr) logits, computed in float32 (or float64 for float64 inputs) outside autocast.
    """
    if query_tokens.dim() != 3 or reference_tokens.dim() != 3:
        raise ShapeError(
            f"tokens must be (B, L, C); got query {tuple(query_tokens.shape)} "
            f"and reference {tuple(reference_tokens.shape)}"
        )
    if query_tokens.shape[0] != reference_tokens.shape[0] or query_tokens.shape[2] != reference_tokens.shape[2]:
        raise ShapeError(
            f"query tokens {tuple(query_tokens.shape)} and reference tokens {tuple(reference_tokens.shape)} "
            "differ in batch size or channels"
        )
    if not temperature > 0:
        raise ConfigError(f"temperature must be positive, got {temperature}")
    dtype = _compute_dtype(query_tokens)
    with torch.autocast(device_type=query_tokens.device.type, enabled=False):
        query = F.normalize(query_tokens.to(dtype), dim=-1)
        reference = F.normalize(reference_tokens.to(dtype), dim=-1)
        return torch.bmm(query, reference.transpose(1, 2)) / temperature


def _sharpen(overlap: torch.Tensor, gamma: float) -> torch.Tensor:
    """Unnormalised target weights ``q-hat_ij ** gamma`` per row; exactly 0 where ``q-hat_ij == 0``.

    ``gamma = 0`` gives 1 on every positive entry (uniform over the overlapping patches) and
    ``gamma = inf`` gives 1 on the entries equal to the row maximum (one-hot, or uniform over
    ties): the exact limits, as the paper's supplement re-implements them. For finite positive
    ``gamma`` the row is divided by its maximum before the power, which leaves the normalised
    weights unchanged but cannot underflow for large ``gamma``. The prior carries no gradient.
    """
    overlap = overlap.detach()
    positive = overlap > 0
    if gamma == 0:
        return positive.to(overlap.dtype)
    row_max = overlap.amax(dim=-1, keepdim=True)
    if math.isinf(gamma):
        return (positive & (overlap == row_max)).to(overlap.dtype)
    # Safe base: zero entries are replaced by 1 before the power and masked after, so no
    # 0 ** gamma (NaN or inf for gamma < 0 is excluded above) ever enters the computation.
    safe_ratio = torch.where(positive, overlap / row_max.clamp_min(torch.finfo(overlap.dtype).tiny), 1.0)
    return torch.where(positive, safe_ratio.pow(gamma), 0.0)


def overlap_target(overlap: torch.Tensor, gamma: float = 1.0, weighting: str = "paper") -> tuple[torch.Tensor, torch.Tensor]:
    """Target distribution ``q(R^r_j | R^q_i)`` of CopyNCE from an overlap prior (paper eq. for q).

    Args:
        overlap: (B, Lq, Lr) prior ``q-hat`` from PixTrace; rows sum to at most 1.
        gamma: confidence sharpening exponent, ``>= 0``; ``float('inf')`` for the one-hot limit.
        weighting: ``"paper"``: ``w_ij = q-hat_ij^gamma / sum_k q-hat_ik^gamma`` on rows with
            some overlap (rows without any are all zero). ``"authors_code"``: the authors' code's
            variant, where the untraced share of the patch, ``1 - sum_k q-hat_ik``, is an extra
            "nowhere" column that takes part in the normalisation; its weight is then dropped
            (that column has no token), so such a row sums to less than 1 and a row without
            overlap is all zero.

    Returns:
        ``(weights, rows)``: weights (B, Lq, Lr), float, no gradient; rows (B, Lq) bool,
        the query patches with some overlap.
    """
    if weighting not in WEIGHTINGS:
        raise ConfigError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if not (gamma >= 0):
        raise ConfigError(f"gamma must be >= 0 (or inf), got {gamma}")
    if overlap.dim() != 3:
        raise ShapeError(f"overlap prior must be (B, L_a, L_b), got shape {tuple(overlap.shape)}")
    overlap = overlap.detach()
    rows = (overlap > 0).any(dim=-1)
    if weighting == "authors_code":
        nowhere = 1.0 - overlap.sum(dim=-1, keepdim=True)
        nowhere = torch.where(nowhere > _NOWHERE_TOLERANCE, nowhere, 0.0)
        overlap = torch.cat([overlap, nowhere], dim=-1)
    weights = _sharpen(overlap, gamma)
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
    if weighting == "authors_code":
        weights = weights[..., :-1]
    return weights, rows


def _directional_copynce(
    logits: torch.Tensor, overlap: torch.Tensor, gamma: float, weighting: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paper equation "CopyNCE #3" for one direction, per pair.

    Args:
        logits: (B, La, Lb) ``s_ij``; the softmax runs over the ``Lb`` patches of the other image.
        overlap: (B, La, Lb) prior of this direction.

    Returns:
        ``(loss, has_overlap)``, both (B,): the mean over query patches of
        ``-sum_j w_ij log p_ij`` (over patches with overlap for ``"paper"``, over all for
        ``"authors_code"``), and whether any patch of the pair overlaps.
    """
    if overlap.shape != logits.shape:
        raise ShapeError(f"overlap prior of shape {tuple(overlap.shape)} does not match the token grid "
                           f"{tuple(logits.shape)} (B, L_a, L_b)")
    weights, rows = overlap_target(overlap.to(logits.dtype), gamma, weighting)
    log_p = torch.log_softmax(logits, dim=-1)  # finite everywhere, so 0 * log p = 0 exactly
    per_patch = -(weights * log_p).sum(dim=-1)  # (B, La) cross-entropy against the target
    has_overlap = rows.any(dim=-1)
    if weighting == "paper":
        count = rows.sum(dim=-1).clamp_min(1).to(per_patch.dtype)
        loss = (per_patch * rows.to(per_patch.dtype)).sum(dim=-1) / count
    else:
        loss = per_patch.mean(dim=-1)
    return loss, has_overlap


def copynce_loss(
    query_tokens: torch.Tensor,
    reference_tokens: torch.Tensor,
    overlap_qr: torch.Tensor,
    overlap_rq: torch.Tensor,
    temperature: float = 1 / 16,
    gamma: float = 1.0,
    weighting: str = "paper",
    pair_mask: torch.Tensor | None = None,
    average: str = "overlap_pairs",
) -> torch.Tensor:
    """Symmetric CopyNCE loss of a batch of copy pairs (paper equations "CopyNCE #3" and "CopyNCE").

    For the direction q -> r of one pair: ``s_ij = cos(z^q_i, z^r_j) / tau``, ``p_ij`` its
    softmax over the reference patches ``j``, the target ``w_ij = q-hat_ij^gamma / sum_k
    q-hat_ik^gamma`` on every query patch ``i`` with some overlap, ``l_i = -sum_j w_ij log p_ij``
    and ``L_qr`` the mean of ``l_i`` over those patches. ``L_rq`` is the same with the roles
    swapped (prior ``overlap_rq``, softmax over query patches). The pair's loss is
    ``(L_qr + L_rq) / 2``, and the batch loss the mean over the pairs that have overlap in
    both directions (and are selected by ``pair_mask``). A batch with no such pair gives a
    zero that still depends on the tokens, so every process of a distributed run runs the
    same backward graph.

    ``gamma = 0`` (uniform over overlapping patches) and ``gamma = inf`` (uniform over the
    patches of maximal overlap, normally one-hot) are computed exactly, not as limits.

    ``weighting="authors_code"`` reproduces the authors' released code instead: the untraced
    share ``1 - sum_j q-hat_ij`` of a patch is an extra "nowhere" column in the target's
    normalisation (it has no token, so its share of the target is dropped from the
    cross-entropy rather than given a logit), and ``L_qr`` is the mean over ALL query
    patches, those without overlap contributing zero. Partly traced patches therefore weigh
    less. Pair selection is the same as for ``"paper"``.

    Args:
        query_tokens: (B, Lq, C) patch tokens of the queries (no CLS token).
        reference_tokens: (B, Lr, C) patch tokens of the references.
        overlap_qr: (B, Lq, Lr) PixTrace prior, query patch ``i`` into reference patch ``j``.
        overlap_rq: (B, Lr, Lq) PixTrace prior of the other direction.
        temperature: ``tau``, 1/16 in the paper.
        gamma: confidence sharpening, ``>= 0`` or ``float('inf')`` (descriptor 3, matcher 1).
        weighting: ``"paper"`` or ``"authors_code"`` (see above).
        pair_mask: optional (B,) bool, pairs allowed to contribute (e.g. only positive pairs).
        average: ``"overlap_pairs"``: the mean over the contributing pairs (above);
            ``"all_pairs"`` (the authors' code): their sum divided by ``B``, every pair of the
            batch counted (negatives and pairs without overlap contribute zero), so a batch with a
            share ``s`` of contributing pairs weighs CopyNCE ``s`` times less.

    Returns:
        Scalar tensor (float32, or float64 for float64 tokens).
    """
    if average not in AVERAGES:
        raise ConfigError(f"average must be one of {AVERAGES}, got {average!r}")
    logits = token_affinity_logits(query_tokens, reference_tokens, temperature)
    pair_loss, valid = _pair_losses(logits, overlap_qr, overlap_rq, gamma, weighting, pair_mask)
    return _average_pairs(pair_loss, valid, average)


def _pair_losses(
    logits: torch.Tensor, overlap_qr: torch.Tensor, overlap_rq: torch.Tensor, gamma: float, weighting: str,
    pair_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paper equation "CopyNCE" per pair: ``(L_qr + L_rq) / 2``, and which pairs contribute to the batch loss.

    Args:
        logits: (B, Lq, Lr) ``s_ij`` of each pair; the direction r -> q reads its transpose.
        overlap_qr: (B, Lq, Lr) and overlap_rq: (B, Lr, Lq), the priors of the two directions.
        pair_mask: optional (B,) bool, pairs allowed to contribute.

    Returns:
        ``(pair_loss, valid)``, both (B,): each pair's loss, and whether it has overlap in both directions
        (and is selected by ``pair_mask``).
    """
    batch = logits.shape[0]
    if overlap_rq.shape != logits.shape[:1] + logits.shape[2:0:-1]:
        raise ShapeError(f"overlap_rq has shape {tuple(overlap_rq.shape)}, expected "
                           f"{(batch, logits.shape[2], logits.shape[1])} (B, Lr, Lq)")
    loss_qr, has_qr = _directional_copynce(logits, overlap_qr, gamma, weighting)
    loss_rq, has_rq = _directional_copynce(logits.transpose(1, 2), overlap_rq, gamma, weighting)
    valid = has_qr & has_rq
    if pair_mask is not None:
        if pair_mask.shape != (batch,):
            raise ShapeError(f"pair_mask must have shape ({batch},), got {tuple(pair_mask.shape)}")
        valid = valid & pair_mask.to(device=valid.device, dtype=torch.bool)
    return 0.5 * (loss_qr + loss_rq), valid


def _average_pairs(pair_loss: torch.Tensor, valid: torch.Tensor, average: str) -> torch.Tensor:
    """The batch loss from the (B,) pair losses and the (B,) bool contributing pairs: their mean
    (``"overlap_pairs"``) or their sum divided by ``B`` (``"all_pairs"``); a scalar."""
    if not bool(valid.any()):
        # Zero with a gradient path through both token tensors (all gradients are zero).
        return 0.0 * pair_loss.sum()
    if average == "all_pairs":
        return pair_loss[valid].sum() / pair_loss.shape[0]
    return pair_loss[valid].mean()


class _GatherRows(torch.autograd.Function):
    """All-gather of ``(B, D)`` rows over the process group, differentiable.

    Forward: ``dist.all_gather`` of every process's ``(B, D)`` into ``(B * world, D)``, rank order.
    Backward: every process holds a gradient for the whole ``(B * world, D)`` output; their sum
    (one ``all_reduce``) sliced at this rank's rows is the gradient of its input. Written here
    rather than taken from ``torch.distributed.nn.functional`` (deprecated), whose gloo backward
    emulates reduce-scatter with an all-to-all that intermittently aborted processes at
    ``destroy_process_group``.
    """

    @staticmethod
    def forward(ctx, rows: torch.Tensor) -> torch.Tensor:
        rows = rows.contiguous()
        gathered = [torch.empty_like(rows) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, rows)
        ctx.rank, ctx.rows = dist.get_rank(), rows.shape[0]
        return torch.cat(gathered, dim=0)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:
        grad = grad_output.clone(memory_format=torch.contiguous_format)  # all_reduce works in place
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _gathered(rows: torch.Tensor, gradients: bool = True) -> tuple[torch.Tensor, int]:
    """``(rows of every process (B * world, D), offset of this process's rows)``.

    ``gradients=True``: differentiable for every row (the backward all-reduces, :class:`_GatherRows`);
    ``False`` (the authors' code): the other processes' rows are constants, only this process's rows
    (put back in place) carry gradient.
    """
    if not _distributed():
        return rows, 0
    offset = dist.get_rank() * rows.shape[0]
    if gradients:
        return _GatherRows.apply(rows), offset
    gathered = [torch.empty_like(rows) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, rows.detach().contiguous())
    gathered[dist.get_rank()] = rows
    return torch.cat(gathered, dim=0), offset


def info_nce_loss(
    query_descriptors: torch.Tensor,
    reference_descriptors: torch.Tensor,
    logit_scale: torch.Tensor | float,
    max_scale: float | None = 100.0,
    negatives: str = "cross_view",
    gather_gradients: bool = True,
) -> torch.Tensor:
    """Symmetric InfoNCE between the query and reference descriptors of a batch of copy pairs.

    ``logits = min(exp(logit_scale), max_scale) * cosine similarity`` (paper eq. "InfoNCE", used as
    the descriptor baseline with a learnable log-scale initialised at 3.2, so ``exp = 24.5``; the
    clamp at 100 follows CLIP and stops its gradient when reached; the authors' code has none:
    ``max_scale=None``). Two forms:

    * ``negatives="cross_view"``: row ``b`` of the queries has its own reference as the positive
      and every other reference as a negative, and likewise for the references against the
      queries; the loss is the mean of the two cross-entropies (``N - 1`` negatives per anchor).
    * ``negatives="all_embeddings"`` (SSCD's form, the authors' code): the ``2N`` descriptors of
      the batch (queries and references) are all anchors; each one's positive is its partner and
      every other descriptor but itself is a negative (``2N - 2`` negatives per anchor); the loss
      is the mean cross-entropy over the ``2N`` anchors.

    When ``torch.distributed`` is initialised with more than one process, the descriptors of
    all processes are gathered with gradients (an all-gather whose backward all-reduces), the
    local rows are scored against the global batch (``N`` = pairs of all processes) and the loss
    is the mean over the local rows; every process must pass the same ``B``. With
    ``gather_gradients=False`` (the authors' code) the other processes' descriptors are gathered as
    constants: a process's rows get no gradient from the other processes' losses.

    Args:
        query_descriptors: (B, D), unit norm.
        reference_descriptors: (B, D), unit norm; row ``b`` is the copy pair of query ``b``.
        logit_scale: scalar tensor (learnable log of the inverse temperature) or float.
        max_scale: upper bound of ``exp(logit_scale)``, or ``None`` for none.
        negatives: ``"cross_view"`` or ``"all_embeddings"``.
        gather_gradients: gather the other processes' descriptors with gradients (``True``) or as
            constants (``False``).

    Returns:
        Scalar tensor.
    """
    if query_descriptors.dim() != 2 or query_descriptors.shape != reference_descriptors.shape:
        raise ShapeError(
            f"descriptors must both be (B, D) with equal shapes; got {tuple(query_descriptors.shape)} "
            f"and {tuple(reference_descriptors.shape)}"
        )
    if negatives not in INFONCE_NEGATIVES:
        raise ConfigError(f"negatives must be one of {INFONCE_NEGATIVES}, got {negatives!r}")
    batch = query_descriptors.shape[0]
    dtype = _compute_dtype(query_descriptors)
    queries, references = query_descriptors.to(dtype), reference_descriptors.to(dtype)
    scale = _inverse_temperature(logit_scale, max_scale, dtype, queries.device)
    all_queries, offset = _gathered(queries, gather_gradients)  # (N, D)
    all_references, _ = _gathered(references, gather_gradients)
    targets = torch.arange(batch, device=queries.device) + offset
    if negatives == "cross_view":
        return _cross_view_info_nce(scale, queries, references, all_queries, all_references, targets)
    return _all_embeddings_info_nce(scale, queries, references, all_queries, all_references, targets)


def _inverse_temperature(logit_scale: torch.Tensor | float, max_scale: float | None, dtype: torch.dtype,
                         device: torch.device) -> torch.Tensor:
    """``min(exp(logit_scale), max_scale)``, a scalar tensor of ``dtype`` (no clamp for ``max_scale=None``)."""
    scale = torch.as_tensor(logit_scale, dtype=dtype, device=device).exp()
    if max_scale is not None:
        scale = scale.clamp(max=max_scale)
    return scale


def _cross_view_info_nce(scale: torch.Tensor, queries: torch.Tensor, references: torch.Tensor,
                         all_queries: torch.Tensor, all_references: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """InfoNCE with the other view's descriptors as negatives: this process's (B, D) queries against the (N, D)
    references of every process, and its references against every query; ``targets`` (B,) are the columns of the
    positives. The mean of the two cross-entropies, a scalar."""
    logits_qr = scale * queries @ all_references.T  # (B, N)
    logits_rq = scale * references @ all_queries.T
    return 0.5 * (F.cross_entropy(logits_qr, targets) + F.cross_entropy(logits_rq, targets))


def _all_embeddings_info_nce(scale: torch.Tensor, queries: torch.Tensor, references: torch.Tensor,
                             all_queries: torch.Tensor, all_references: torch.Tensor,
                             targets: torch.Tensor) -> torch.Tensor:
    """InfoNCE over every descriptor (SSCD's form): this process's 2B rows (queries (B, D), then references)
    against the 2N columns (every process's queries, then references), each row's own column masked out and its
    partner the positive (``targets`` (B,): the queries' columns). The mean cross-entropy, a scalar."""
    total = all_queries.shape[0]
    columns = torch.cat([all_queries, all_references])  # (2N, D): queries, then references
    rows = torch.cat([queries, references])  # (2B, D)
    own = torch.cat([targets, targets + total])  # each row's own column
    partner = torch.cat([targets + total, targets])
    logits = scale * rows @ columns.T  # (2B, 2N)
    itself = torch.zeros_like(logits, dtype=torch.bool)
    itself[torch.arange(2 * queries.shape[0], device=logits.device), own] = True
    return F.cross_entropy(logits.masked_fill(itself, float("-inf")), partner)


def koleo_loss(descriptors: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """KoLeo regulariser (Sablayrolles et al. 2018, "Spreading vectors for similarity search").

    ``-1/B sum_b log(min_{c != b} ||x_b - x_c|| + eps)`` over the L2-normalised descriptors
    of the batch, the Kozachenko-Leonenko entropy estimate up to constants (as DINOv2's
    ``KoLeoLoss``); it pushes each descriptor away from its nearest neighbour. The
    neighbour is chosen without gradient; the distance carries it.

    Args:
        descriptors: (B, D) with B >= 2 (normalised here, so any norm is accepted).
        eps: added to the distance inside the log.

    Returns:
        Scalar tensor.
    """
    if descriptors.dim() != 2 or descriptors.shape[0] < 2:
        raise ShapeError(f"KoLeo needs (B, D) descriptors with B >= 2, got shape {tuple(descriptors.shape)}")
    x = F.normalize(descriptors.to(_compute_dtype(descriptors)), dim=-1)
    with torch.no_grad():
        similarity = x @ x.T
        similarity.fill_diagonal_(-float("inf"))
        nearest = similarity.argmax(dim=1)  # on the unit sphere, max cosine = min distance
    distances = (x - x[nearest]).norm(dim=-1)
    return -torch.log(distances + eps).mean()


def paired_koleo_loss(
    query_descriptors: torch.Tensor, reference_descriptors: torch.Tensor, eps: float = 1e-8,
    gather_gradients: bool = True,
) -> torch.Tensor:
    """KoLeo over all ``2N`` descriptors of the batch, each descriptor's partner excluded.

    The queries and references of every process (gathered as in
    :func:`info_nce_loss`) form one set of ``2N`` L2-normalised descriptors; for each local
    descriptor ``x_b`` the nearest other descriptor is searched among them, excluding ``x_b``
    itself and its partner (the other view of its copy pair, which it should be close to), and
    the loss is ``-mean_b log(||x_b - x_nn(b)|| + eps)`` over the local ``2B`` descriptors. With
    fewer than two pairs in the global batch there is no candidate and the loss is zero (with a
    gradient path).

    Args:
        query_descriptors: (B, D).
        reference_descriptors: (B, D); row ``b`` is the partner of query ``b``.
        eps: added to the distance inside the log.
        gather_gradients: gather the other processes' descriptors with gradients (``True``) or as
            constants (``False``, the authors' code).

    Returns:
        Scalar tensor.
    """
    if query_descriptors.dim() != 2 or query_descriptors.shape != reference_descriptors.shape:
        raise ShapeError(f"KoLeo needs two (B, D) descriptor sets of one shape, got "
                           f"{tuple(query_descriptors.shape)} and {tuple(reference_descriptors.shape)}")
    dtype = _compute_dtype(query_descriptors)
    queries = F.normalize(query_descriptors.to(dtype), dim=-1)
    references = F.normalize(reference_descriptors.to(dtype), dim=-1)
    batch = queries.shape[0]
    all_queries, offset = _gathered(queries, gather_gradients)
    all_references, _ = _gathered(references, gather_gradients)
    total = all_queries.shape[0]
    rows = torch.cat([queries, references])  # (2B, D)
    if total < 2:
        return 0.0 * rows.sum()
    columns = torch.cat([all_queries, all_references])  # (2N, D)
    local = torch.arange(batch, device=rows.device) + offset
    own = torch.cat([local, local + total])
    partner = torch.cat([local + total, local])
    with torch.no_grad():
        similarity = rows @ columns.T
        index = torch.arange(2 * batch, device=rows.device)
        similarity[index, own] = -float("inf")
        similarity[index, partner] = -float("inf")
        nearest = similarity.argmax(dim=1)  # on the unit sphere, max cosine = min distance
    distances = (rows - columns[nearest]).norm(dim=-1)
    return -torch.log(distances + eps).mean()


def copy_bce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Matcher baseline: binary cross-entropy with logits (paper, "BCE acts as the matcher baseline").

    Args:
        logits: (B,) copy logits.
        labels: (B,) 1 for a copy pair, 0 for a negative pair (any numeric dtype).

    Returns:
        Scalar tensor, the mean over the batch.
    """
    if logits.shape != labels.shape:
        raise ShapeError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} differ in shape")
    dtype = _compute_dtype(logits)
    return F.binary_cross_entropy_with_logits(logits.to(dtype), labels.to(dtype))


def affinity_entropy(
    query_tokens: torch.Tensor, reference_tokens: torch.Tensor, temperature: float = 1 / 16
) -> torch.Tensor:
    """Affinity entropy of every query token (paper eq. "affinity entropy").

    ``E_i = -sum_j p_ij log p_ij`` with ``p_ij`` the softmax over reference tokens of
    ``cos(z^q_i, z^r_j) / tau``. Low entropy marks query patches whose affinity concentrates
    on a few reference patches, i.e. the copied region.

    Args:
        query_tokens: (B, Lq, C).
        reference_tokens: (B, Lr, C).
        temperature: ``tau``.

    Returns:
        (B, Lq), in nats, between 0 and ``log(Lr)``.
    """
    log_p = torch.log_softmax(token_affinity_logits(query_tokens, reference_tokens, temperature), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)
