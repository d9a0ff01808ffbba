"""Content tokens: the patch tokens of an image that are not shared with many of its neighbours.

Beyond the paper. The CopyNCE models were trained on an edited query against an unedited reference,
never on two images sharing a template (a screenshot frame, a meme band, a background photo) without
sharing content, so a template alone makes a pair look like a copy. A patch token of image ``i`` is
*bursty* when, in at least ``min_images`` of ``i``'s neighbour images, some token (any position) has a
cosine above ``tau`` with it: such a region is common to many images of the collection (a template, a
watermark), not the content of a copy pair. Dropping those tokens before the matcher's fusion blocks
(:func:`fuse_content`) or from the descriptor's input sequence (:func:`content_descriptors`) makes the
models decide on the rest of the image.

A token is never dropped everywhere: when every token of an image would go (an image that is all
template, or whose neighbours are all copies of it) the image keeps them all, and the batched form says
which images fell back so that callers can count them.

Everything here is a pure function of tensors; the neighbours, caches and passes are
:mod:`copynce_hf.retrieval.content.masks`'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from ...modeling.errors import ConfigError, ShapeError
from ..presets import MIN_IMAGES, NEIGHBOURS

#: Elements of one similarity block (tokens x neighbour tokens) computed at once, bounding the memory.
_BLOCK_ELEMENTS = 1 << 24


@dataclasses.dataclass(frozen=True)
class ContentSettings:
    """How bursty tokens are found.

    Attributes:
        tau: the cosine above which two tokens match (-1 < tau < 1).
        min_images: a token matched in at least this many neighbour images is bursty (>= 1).
        neighbours: the neighbour images each image is compared with (>= 1).
    """

    tau: float
    min_images: int = MIN_IMAGES
    neighbours: int = NEIGHBOURS

    def __post_init__(self) -> None:
        check_content_settings(self.tau, self.min_images, self.neighbours)

    def identity(self) -> dict[str, float | int]:
        """The settings as a JSON-able dict (the identity of saved scores)."""
        return dataclasses.asdict(self)


def check_content_settings(tau: float, min_images: int, neighbours: int, tau_name: str = "content_tau") -> None:
    """Refuse settings that cannot find bursty tokens (``tau_name`` names the cosine in the message)."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not -1.0 < float(tau) < 1.0:
        raise ConfigError(f"{tau_name} must be a cosine strictly between -1 and 1, got {tau!r}")
    for name, value in (("content_min_images", min_images), ("content_neighbours", neighbours)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a whole number of at least 1, got {value!r}")
    if min_images > neighbours:
        raise ConfigError(f"content_min_images ({min_images}) cannot exceed content_neighbours ({neighbours}): "
                          "no token could be bursty")


def unit_patch_tokens(encoded: torch.Tensor) -> torch.Tensor:
    """(B, 1 + L, C) tokens, CLS first -> (B, L, C) unit-norm float32 patch tokens."""
    if encoded.dim() != 3:
        raise ShapeError(f"encoded tokens must be (B, 1 + L, C), got {tuple(encoded.shape)}")
    return torch.nn.functional.normalize(encoded[:, 1:].float(), dim=-1)


def matched_in(tokens: torch.Tensor, others: torch.Tensor, tau: float) -> torch.Tensor:
    """Which tokens of each image have a match in each other image.

    Args:
        tokens: (N, L, C) unit-norm patch tokens.
        others: (M, L', C) unit-norm patch tokens.
        tau: the matching cosine.

    Returns:
        (N, M, L) bool: token ``l`` of image ``n`` has a cosine above ``tau`` with some token of image ``m``.
    """
    if tokens.dim() != 3 or others.dim() != 3 or tokens.shape[-1] != others.shape[-1]:
        raise ShapeError(f"tokens (N, L, C) and others (M, L', C) of one width, got {tuple(tokens.shape)} "
                         f"and {tuple(others.shape)}")
    count, length = tokens.shape[:2]
    result = torch.zeros((count, others.shape[0], length), dtype=torch.bool, device=tokens.device)
    pair_elements = max(1, length * others.shape[1])  # one image against one other: (L, L') cosines
    images = max(1, min(count, _BLOCK_ELEMENTS // pair_elements))
    per_block = max(1, _BLOCK_ELEMENTS // (pair_elements * images))
    others = others.to(tokens.dtype)
    for first in range(0, count, images):
        for start in range(0, others.shape[0], per_block):
            cosines = torch.einsum("nlc,mkc->nmlk", tokens[first:first + images], others[start:start + per_block])
            result[first:first + images, start:start + per_block] = cosines.amax(-1) > tau  # (n, m, L)
    return result


def bursty_tokens(tokens: torch.Tensor, neighbour_tokens: torch.Tensor, tau: float, min_images: int) -> torch.Tensor:
    """(L, C) unit-norm tokens of one image, (K, L', C) of its neighbours -> (L,) bool: matched (cosine above
    ``tau``) in at least ``min_images`` of the neighbours."""
    if tokens.dim() != 2:
        raise ShapeError(f"tokens must be (L, C), got {tuple(tokens.shape)}")
    return matched_in(tokens[None], neighbour_tokens, tau)[0].sum(0) >= min_images


def bursty_keep(tokens: torch.Tensor, neighbour_tokens: torch.Tensor, tau: float, min_images: int) -> torch.Tensor:
    """The tokens to keep of one image: (L, C) unit-norm tokens, (K, L', C) unit-norm tokens of its neighbours ->
    (L,) bool, ``False`` for bursty tokens (:func:`bursty_tokens`); all ``True`` when every token is bursty."""
    bursty = bursty_tokens(tokens, neighbour_tokens, tau, min_images)
    return torch.ones_like(bursty) if bool(bursty.all()) else ~bursty


@dataclasses.dataclass
class KeepMasks:
    """Keep masks of many images: ``keep`` (N, L) bool; ``fell_back`` (N,) bool, the images whose every token was
    bursty (kept whole instead)."""

    keep: torch.Tensor
    fell_back: torch.Tensor

    @property
    def dropped(self) -> float:
        """The share of tokens dropped."""
        return 1.0 - float(self.keep.float().mean()) if self.keep.numel() else 0.0


def bursty_keep_batch(tokens: torch.Tensor, pool: torch.Tensor, neighbours: torch.Tensor, tau: float,
                      min_images: int) -> KeepMasks:
    """:func:`bursty_keep` for many images.

    Args:
        tokens: (N, L, C) unit-norm patch tokens of the images.
        pool: (M, L', C) unit-norm patch tokens of the neighbour images.
        neighbours: (N, K) long, row ``n`` the rows of ``pool`` that are image ``n``'s neighbours; ``-1`` pads a
            row with fewer neighbours.
        tau, min_images: as :func:`bursty_tokens`.
    """
    if neighbours.dim() != 2 or neighbours.shape[0] != tokens.shape[0]:
        raise ShapeError(f"neighbours must be (N, K) for {tokens.shape[0]} images, got {tuple(neighbours.shape)}")
    keep = torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device)
    fell_back = torch.zeros(tokens.shape[0], dtype=torch.bool)
    for row in range(tokens.shape[0]):
        chosen = neighbours[row][neighbours[row] >= 0]
        if len(chosen) < min_images:
            continue
        bursty = bursty_tokens(tokens[row], pool[chosen.to(pool.device)], tau, min_images)
        if bool(bursty.all()):
            fell_back[row] = True
        else:
            keep[row] = ~bursty
    return KeepMasks(keep, fell_back)


def pair_keep(matched: torch.Tensor, min_images: int, partner: int | None = None) -> tuple[torch.Tensor, bool]:
    """The tokens of an image to keep when it is scored against one partner image.

    Args:
        matched: (K, L) bool, row ``k``: the image's tokens matched in its neighbour ``k``.
        min_images: a token matched in this many neighbours is bursty.
        partner: the row of the image it is scored against, left out of the count (its match is the evidence
            being weighed, not a sign of a template); ``None``: every row counts.

    Returns:
        ``(keep (L,) bool, fell back)``: every token kept, and ``True``, when every token is bursty.
    """
    rows = torch.ones(matched.shape[0], dtype=torch.bool)
    if partner is not None:
        rows[partner] = False
    bursty = matched[rows].sum(0) >= min_images
    if bool(bursty.all()):
        return torch.ones_like(bursty), True
    return ~bursty, False


@dataclasses.dataclass
class PairMasks:
    """Keep masks of the two sides of many pairs: ``query`` (P, L) and ``reference`` (P, L') bool, and
    ``kept_whole`` the masks of every token (each side of each pair counts once) that fell back to keeping all."""

    query: torch.Tensor
    reference: torch.Tensor
    kept_whole: int


def local_keep_masks(query: torch.Tensor, candidates: torch.Tensor, settings: ContentSettings,
                     candidate_matched: torch.Tensor | None = None) -> PairMasks:
    """Keep masks of a query and each of its candidate references, pair by pair, within that local set.

    The neighbours are the query's first ``settings.neighbours`` candidates (the candidates come best first): in
    the pair of candidate ``r``, the query's tokens are counted in those neighbours and ``r``'s tokens in the
    same neighbours, ``r`` itself left out on both sides (:func:`pair_keep`: what the query shares with ``r`` is
    the evidence; a token is bursty when enough *other* images share it).

    Args:
        query: (L, C) unit-norm patch tokens of the query.
        candidates: (R, L', C) unit-norm patch tokens of its candidates, best first.

        candidate_matched: (R, top, L') bool, ``matched_in(candidates, candidates[:top], tau)`` already known (it
            does not depend on the query, so a caller may keep it from query to query); ``None``: computed here.

    Returns:
        :class:`PairMasks` of the R pairs: query (R, L), reference (R, L').
    """
    if query.dim() != 2 or candidates.dim() != 3 or candidates.shape[-1] != query.shape[-1]:
        raise ShapeError(f"query tokens (L, C) and candidate tokens (R, L', C), got {tuple(query.shape)} and "
                         f"{tuple(candidates.shape)}")
    top = min(settings.neighbours, len(candidates))
    neighbours = candidates[:top]
    query_matched = matched_in(query[None], neighbours, settings.tau)[0]  # (top, L)
    if candidate_matched is None:
        candidate_matched = matched_in(candidates, neighbours, settings.tau)  # (R, top, L')
    query_keep, reference_keep, kept_whole = [], [], 0
    for row in range(len(candidates)):
        partner = row if row < top else None
        for matched, kept in ((query_matched, query_keep), (candidate_matched[row], reference_keep)):
            keep, fell_back = pair_keep(matched, settings.min_images, partner)
            kept.append(keep)
            kept_whole += fell_back
    return PairMasks(torch.stack(query_keep), torch.stack(reference_keep), kept_whole)


def keep_tokens(encoded: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(1 + L, C) tokens (CLS first) and (L,) bool -> (1 + n, C): the CLS and the kept patch tokens, in order."""
    if encoded.dim() != 2 or keep.shape != (encoded.shape[0] - 1,):
        raise ShapeError(f"encoded tokens (1 + L, C) and keep (L,), got {tuple(encoded.shape)} and "
                         f"{tuple(keep.shape)}")
    return torch.cat([encoded[:1], encoded[1:][keep.to(encoded.device)]])


def fuse_kept(fuse: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], queries: Sequence[torch.Tensor],
              references: Sequence[torch.Tensor], batch_size: int = 64) -> torch.Tensor:
    """The matcher's logits of pairs whose token sequences differ in length.

    Args:
        fuse: ``fuse(query (B, 1 + Lq, C), reference (B, 1 + Lr, C)) -> logits (B,)`` (the matcher's fusion
            stage).
        queries, references: pair ``p`` is ``queries[p]`` (1 + n_p, C) with ``references[p]`` (1 + m_p, C).
        batch_size: pairs per fusion pass; pairs of equal ``(n_p, m_p)`` share a pass.

    Returns:
        (P,) float32 logits.
    """
    if len(queries) != len(references):
        raise ShapeError(f"{len(queries)} query sequences for {len(references)} reference sequences")
    groups: dict[tuple[int, int], list[int]] = {}
    for pair, (query, reference) in enumerate(zip(queries, references)):
        groups.setdefault((len(query), len(reference)), []).append(pair)
    logits = torch.empty(len(queries), dtype=torch.float32)
    for rows in groups.values():
        for start in range(0, len(rows), batch_size):
            part = rows[start:start + batch_size]
            values = fuse(torch.stack([queries[p] for p in part]), torch.stack([references[p] for p in part]))
            logits[part] = values.float().cpu()
    return logits


def fuse_content(matcher, query_encoded: torch.Tensor, reference_encoded: torch.Tensor, keep_query: torch.Tensor,
                 keep_reference: torch.Tensor) -> torch.Tensor:
    """The matcher's logit (a 0-d tensor) of one pair on its content tokens: the encoder tokens (1 + L, C) and
    (1 + L', C) of :meth:`~copynce_hf.modeling.CopyNCEMatcherModel.pre_fusion_tokens` (CLS first), without the
    patch tokens whose ``keep_query`` (L,) / ``keep_reference`` (L',) is ``False``, through
    :meth:`~copynce_hf.modeling.CopyNCEMatcherModel.fuse`. The tokens carry their position embeddings from the
    encoder, so the kept ones keep their places."""
    return fuse_kept(lambda query, reference: matcher.fuse(query, reference)[0],
                     [keep_tokens(query_encoded, keep_query)], [keep_tokens(reference_encoded, keep_reference)])[0]


def content_descriptors(model, pixel_values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """CopyNCE descriptors of images from their content tokens: (B, 3, H, W) pixel values and (B, L) bool keep
    masks -> (B, D) unit-norm descriptors.

    Each image's input sequence is its CLS embedding and the patch embeddings (position embeddings added) whose
    ``keep`` is ``True``; the backbone's blocks, final norm and head then run as in
    :meth:`~copynce_hf.modeling.CopyNCEDescriptorModel.get_image_features`, which this equals when every token is
    kept. Images with equal kept counts share a pass.
    """
    vit = getattr(model, "vit", None)
    if vit is None or not hasattr(model, "head"):
        raise ConfigError(f"content descriptors re-run the blocks of a PyTorch CopyNCE descriptor; "
                          f"{type(model).__name__} is not one (ONNX Runtime graphs take every token)")
    embedded = vit.embeddings(pixel_values)  # (B, 1 + L, C), position embeddings added
    if keep.shape != (embedded.shape[0], embedded.shape[1] - 1):
        raise ShapeError(f"keep must be (B, L) = {(embedded.shape[0], embedded.shape[1] - 1)}, got "
                         f"{tuple(keep.shape)}")
    keep = keep.to(embedded.device)
    counts = keep.sum(1)
    descriptors = [None] * embedded.shape[0]
    for count in counts.unique().tolist():
        rows = (counts == count).nonzero().flatten()
        sequence = torch.stack([keep_tokens(embedded[row], keep[row]) for row in rows.tolist()])
        hidden, _, _ = vit.run_blocks(sequence)
        for row, descriptor in zip(rows.tolist(), model.head(vit.norm(hidden)[:, 0])):
            descriptors[row] = descriptor
    return torch.stack(descriptors)
