"""Matcher re-scoring with an encoder-token cache: one encoder pass per image view, batched fusion per pair.

The CopyNCE matcher (paper, "Matcher": enc-8 / fus-4 in the paper, enc-4 / fus-2 in the embedded
model) runs its first blocks on each image alone and only its fusion blocks on the joined pair.
So every image (or LCE view, :mod:`.views`) needs its encoder pass once, however many candidates
it is paired with: :class:`MatcherScorer` keeps the encoded patch tokens of every query view
while that query's candidates are scored and of reference views in a bounded LRU cache, and runs
the fusion blocks on batches of (query view, reference view) token pairs. The pair's copy score is
``sigmoid(logit)``, maximised over the view pairs of the LCE mode (supplementary "Local Crops
Ensembling").

Cost per query with C candidates, Vq query views, Vr reference views and P scored view pairs per
candidate: Vq encoder passes + (new references) x Vr encoder passes + C x P fusion passes, instead
of C x P full matcher forwards (each of which encodes both images again).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from ...images import load_image
from ...modeling.errors import ConfigError, ImageLoadError
from ...precision import native_bf16
from ...runtime.onnx_runtime import check_content_fusion
from ..content.masks import CollectionMatches, PairMatches
from ..content.store import TokenStore
from ..content.tokens import (
    ContentSettings,
    fuse_kept,
    keep_tokens,
    local_keep_masks,
    unit_patch_tokens,
)
from ..descriptors.views import MATCHER_LCE_MODES, check_mode, matcher_view_pairs, matcher_view_preset
from ..presets import DEFAULT_FUSION_PRECISION, FUSION_PRECISIONS

logger = logging.getLogger(__name__)

ViewFunction = Callable[[Image.Image], list[Image.Image]]


def resolve_fusion_precision(precision: str, model) -> str:
    """``float32`` or ``bfloat16``: ``precision`` (:data:`~copynce_hf.retrieval.presets.FUSION_PRECISIONS`) for
    ``model`` on its device (a model without fusion blocks, a descriptor, is ``float32``)."""
    check_mode(precision, FUSION_PRECISIONS, "fusion_precision")
    if precision == "bfloat16" and not isinstance(model, torch.nn.Module):
        raise ConfigError(f"fusion_precision bfloat16 needs a PyTorch matcher; {type(model).__name__} runs its own "
                          "graph (use float32 or auto)")
    if precision == "float32" or not hasattr(model, "fusion_logits") or not isinstance(model, torch.nn.Module):
        return "float32"
    if precision == "bfloat16":
        return precision
    return "bfloat16" if native_bf16(model.device.type) else "float32"


def _in_precision(fuse: Callable, precision: str, device: torch.device) -> Callable:
    """``fuse`` computing under ``precision`` whatever autocast surrounds it (an accelerator's mixed precision for the
    encoder): ``float32`` with autocast off, ``bfloat16`` under bfloat16 autocast on ``device``."""
    def fused(query: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        if precision == "float32":
            with torch.autocast(device.type, enabled=False):
                return fuse(query.float(), reference.float())
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return fuse(query, reference)  # fusion_logits: float32 logits under autocast

    return fused


def matcher_stages(model) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """The matcher's two stages, the only place that names the model's methods.

    Returns:
        ``pre_fusion_tokens(pixel_values (B, 3, H, W)) -> tokens (B, 1 + L, C)`` (the shared encoder blocks,
        CLS first) and ``fuse(query tokens (B, 1 + Lq, C), reference tokens (B, 1 + Lr, C)) ->
        logits (B,)`` (the fusion blocks and the classifier: the model's ``fusion_logits``, which computes the last
        block's CLS token alone, where it has one; its ONNX Runtime form runs its fusion graph).
    """
    logits = getattr(model, "fusion_logits", None) or (lambda query, reference: model.fuse(query, reference)[0])
    return model.pre_fusion_tokens, logits


class _ViewImages(Dataset):
    """Item ``i``: the processed views (V, 3, H, W) of image ``i`` and ``valid`` (0 if unreadable)."""

    def __init__(self, images: list, views: ViewFunction, image_processor, max_pixels: int | None = None):
        self.images, self.views, self.image_processor = images, views, image_processor
        self.max_pixels = max_pixels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict:
        try:
            image = load_image(self.images[index], max_pixels=self.max_pixels)
            pixels = self.image_processor(images=self.views(image), return_tensors="pt")["pixel_values"]
            return {"index": index, "views": pixels, "valid": 1}
        except ImageLoadError as error:
            logger.warning("skipping image %s: %s", self.images[index], error)
            return {"index": index, "views": None, "valid": 0}


def _first(batch: list[dict]) -> dict:
    return batch[0]


class MatcherScorer:
    """Copy probabilities of (query, reference) pairs with a CopyNCE matcher, cached per view.

    Args:
        model: a ``CopyNCEMatcherModel`` or its ONNX Runtime form (:class:`~copynce_hf.runtime.onnx_runtime.OnnxMatcherModel`):
            anything with ``device`` whose stages :func:`matcher_stages` can call.
        image_processor: its image processor.
        lce: ``none`` (full images, 1 view pair), ``paper`` (35 view pairs) or ``all`` (260), see
            :func:`copynce_hf.retrieval.descriptors.views.matcher_view_pairs`.
        batch_size: view pairs per fusion pass and views per encoder pass.
        cache_size: reference views whose tokens are kept (least recently used dropped first).
        query_views, reference_views, view_pairs: override the LCE mode's views (image -> list of
            view images; view 0 must be the full image) and pair rule ``(Vq, Vr) -> [(qi, ri)]``.
        max_pixels: image size limit of :func:`~copynce_hf.images.load_image` (``None``: its default).
        content: fuse content tokens only (:mod:`copynce_hf.retrieval.content.tokens`, beyond the paper): without
            ``matches``, each query and its candidates are masked pair by pair within that local set
            (:func:`~copynce_hf.retrieval.content.tokens.local_keep_masks`: tokens shared with enough of the query's first
            ``content.neighbours`` candidates, the pair's own candidate left out, are dropped); whole images
            only (``lce`` ``none``). ``None``: every token.
        matches: the images' matches in their own neighbours in the collection
            (:class:`~copynce_hf.retrieval.content.masks.CollectionMatches`): each side of a pair keeps the tokens that are not
            shared with enough neighbours other than the pair's other image. Needs ``content``.
        query_tokens, reference_tokens: the queries' and the references' encoder tokens, already computed
            (:class:`~copynce_hf.retrieval.content.store.TokenStore`, whole images: ``lce`` ``none``): an image a
            store holds is read from it instead of encoded; the others are encoded as without one.
        fusion_precision: the fusion blocks' precision (:data:`~copynce_hf.retrieval.presets.FUSION_PRECISIONS`,
            resolved on the model's device by :func:`resolve_fusion_precision`); the encoder passes run in the
            autocast around them (an accelerator's mixed precision), float32 without one.
    """

    def __init__(self, model, image_processor, lce: str = "none", batch_size: int = 64, cache_size: int = 4096,
                 query_views: ViewFunction | None = None, reference_views: ViewFunction | None = None,
                 view_pairs: Callable[[int, int], list[tuple[int, int]]] | None = None,
                 max_pixels: int | None = None, content: ContentSettings | None = None,
                 matches: CollectionMatches | None = None, query_tokens: TokenStore | None = None,
                 reference_tokens: TokenStore | None = None,
                 fusion_precision: str = DEFAULT_FUSION_PRECISION):
        check_mode(lce, MATCHER_LCE_MODES, "matcher_lce")
        for what, given in (("content tokens", content), ("a token store", query_tokens or reference_tokens)):
            if given is not None and lce != "none":
                raise ConfigError(f"{what} apply to whole images only (matcher_lce none), got matcher_lce {lce!r}")
        if content is not None:
            check_content_fusion(model)
        if matches is not None and content is None:
            raise ConfigError("matches are content tokens: give the content settings too")
        self.content, self.matches = content, matches
        self._pair_matches = PairMatches(content.tau) if content is not None else None  # kept from query to query
        self.query_tokens, self.reference_tokens = query_tokens, reference_tokens
        self.max_pixels = max_pixels
        preset = matcher_view_preset(lce)
        self.model = model.eval()
        self.image_processor = image_processor
        self.lce = lce
        self.batch_size = max(1, int(batch_size))
        self.cache_size = max(1, int(cache_size))
        self.query_views = query_views or preset.query_images
        self.reference_views = reference_views or preset.reference_images
        self.view_pairs = view_pairs or (lambda nq, nr: matcher_view_pairs(lce, nq, nr))
        self.pre_fusion_tokens, fuse = matcher_stages(self.model)
        self.device = self.model.device  # a PreTrainedModel's, or an ONNX Runtime wrapper's (CPU)
        self.fusion_precision = resolve_fusion_precision(fusion_precision, self.model)
        self.fuse = _in_precision(fuse, self.fusion_precision, self.device)
        self._references: OrderedDict[str, torch.Tensor | None] = OrderedDict()
        self._cached_views = 0
        self.encoded_views = 0  # encoder passes run (one per view), for cost reports
        self.fused_pairs = 0  # fusion passes run (one per view pair)
        self.content_counts = {"pairs": 0, "dropped": 0, "tokens": 0, "kept whole": 0}  # local masks (detect)

    # ------------------------------------------------------------------ encoding
    @torch.inference_mode()
    def _encode_views(self, views: torch.Tensor) -> torch.Tensor:
        """(V, 3, H, W) -> (V, L, C) patch tokens, in chunks of ``batch_size``."""
        parts = [self.pre_fusion_tokens(views[i : i + self.batch_size].to(self.device)) for i in range(0, len(views), self.batch_size)]
        self.encoded_views += len(views)
        return torch.cat(parts)

    def _reference_tokens(self, reference_ids: Iterable[str], files: dict) -> None:
        """Encode the views of every reference not cached yet (unreadable ones are cached as ``None``)."""
        needed = list(dict.fromkeys(reference_ids))
        missing = [rid for rid in needed if rid not in self._references]
        for rid in needed:
            if rid in self._references:
                self._references.move_to_end(rid)
        if not missing:
            return
        dataset = _ViewImages([files[rid] for rid in missing], self.reference_views, self.image_processor,
                              self.max_pixels)
        for rid, item in zip(missing, (dataset[i] for i in range(len(dataset)))):
            tokens = self._encode_views(item["views"]) if item["valid"] else None
            self._references[rid] = tokens
            self._cached_views += 0 if tokens is None else len(tokens)
        while self._cached_views > self.cache_size and len(self._references) > len(needed):
            _, dropped = self._references.popitem(last=False)
            self._cached_views -= 0 if dropped is None else len(dropped)

    # ------------------------------------------------------------------ fusion
    @torch.inference_mode()
    def _fuse_max(self, query_tokens: torch.Tensor, references: list[torch.Tensor]) -> list[float]:
        """Max over view pairs of ``sigmoid(fuse(...))`` of one query (Vq, L, C) with each reference (Vr, L, C)."""
        rows_q, rows_r, owners = [], [], []
        for position, reference_tokens in enumerate(references):
            for qi, ri in self.view_pairs(len(query_tokens), len(reference_tokens)):
                rows_q.append(qi)
                rows_r.append((position, ri))
                owners.append(position)
        probabilities = []
        for start in range(0, len(rows_q), self.batch_size):
            q = query_tokens[rows_q[start : start + self.batch_size]]
            r = torch.stack([references[p][ri] for p, ri in rows_r[start : start + self.batch_size]])
            probabilities.append(torch.sigmoid(self.fuse(q, r).float()))
        self.fused_pairs += len(rows_q)
        flat = torch.cat(probabilities).cpu()
        best = torch.full((len(references),), -1.0)
        best.scatter_reduce_(0, torch.tensor(owners), flat, reduce="amax")
        return best.tolist()

    def _masks(self, query_id: str, query_tokens: torch.Tensor, reference_ids: list[str],
               references: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The keep masks of a query (tokens (1, 1 + L, C)), (L,) in its pair with each reference, and of each
        reference (tokens (1, 1 + L', C)), (L',) in its pair with the query: from ``matches``, or from the query's
        local set (counted in :attr:`content_counts`)."""
        if self.matches is not None:
            def keep(image_id: str, partner: str, tokens: torch.Tensor) -> torch.Tensor:
                mask = self.matches.keep(image_id, partner)
                return torch.ones(tokens.shape[1] - 1, dtype=torch.bool) if mask is None else mask

            return ([keep(query_id, reference_id, query_tokens) for reference_id in reference_ids],
                    [keep(reference_id, query_id, tokens) for reference_id, tokens in zip(reference_ids, references)])
        candidates = unit_patch_tokens(torch.cat(references))
        top = min(self.content.neighbours, len(candidates))
        masks = local_keep_masks(unit_patch_tokens(query_tokens)[0], candidates, self.content,
                                 self._pair_matches.among(reference_ids, candidates, top))
        counts = self.content_counts
        counts["pairs"] += len(references)
        counts["dropped"] += int((~masks.query).sum() + (~masks.reference).sum())
        counts["tokens"] += masks.query.numel() + masks.reference.numel()
        counts["kept whole"] += masks.kept_whole
        return list(masks.query), list(masks.reference)

    @torch.inference_mode()
    def _fuse_content(self, query_id: str, query_tokens: torch.Tensor, reference_ids: list[str],
                      references: list[torch.Tensor]) -> list[float]:
        """``sigmoid(fuse(...))`` of one query (1, 1 + L, C) with each reference (1, 1 + L', C) on their content
        tokens (whole images: one view each)."""
        query_keeps, reference_keeps = self._masks(query_id, query_tokens, reference_ids, references)
        logits = fuse_kept(self.fuse, [keep_tokens(query_tokens[0], keep) for keep in query_keeps],
                           [keep_tokens(tokens[0], keep) for tokens, keep in zip(references, reference_keeps)],
                           self.batch_size)
        self.fused_pairs += len(references)
        return torch.sigmoid(logits).tolist()

    def score(self, pairs: list[tuple[str, str]], query_files: dict, reference_files: dict, num_workers: int = 0,
              progress: bool = True, description: str = "matcher",
              on_scored: Callable[[int], None] | None = None) -> list[float | None]:
        """Copy score of every (query id, reference id) pair; ``None`` where an image is missing or unreadable.

        Args:
            pairs: (query id, reference id) pairs, any order (grouped by query internally).
            query_files, reference_files: id -> image (path or PIL image).
            num_workers: ``DataLoader`` workers reading and cutting the query images ahead.
            on_scored: called with the number of pairs of each query once they are scored.
        """
        by_query: dict[str, list[int]] = {}
        for row, (query_id, _reference_id) in enumerate(pairs):
            by_query.setdefault(query_id, []).append(row)
        scores: list[float | None] = [None] * len(pairs)
        query_ids = [qid for qid in by_query if qid in query_files]
        with tqdm(total=len(pairs), desc=description, unit="pair", disable=not progress) as bar:
            for query_id, query_tokens in self._query_tokens(query_ids, query_files, num_workers):
                rows = by_query[query_id]
                if query_tokens is not None:
                    wanted = [row for row in rows if pairs[row][1] in reference_files]
                    found = self._reference_lookup([pairs[row][1] for row in wanted], reference_files)
                    scored = [row for row in wanted if found[pairs[row][1]] is not None]
                    if scored:
                        reference_ids = [pairs[row][1] for row in scored]
                        references = [found[reference_id] for reference_id in reference_ids]
                        values = (self._fuse_content(query_id, query_tokens, reference_ids, references)
                                  if self.content is not None else self._fuse_max(query_tokens, references))
                        for row, value in zip(scored, values):
                            scores[row] = value
                bar.update(len(rows))
                if on_scored is not None:
                    on_scored(len(rows))
        return scores

    def _query_tokens(self, query_ids: list[str], query_files: dict, num_workers: int):
        """``(query id, its views' tokens (Vq, 1 + L, C) or None when unreadable)`` of each query, in order: read
        from :attr:`query_tokens` where it holds them, else encoded (images read ahead by ``num_workers``
        ``DataLoader`` workers)."""
        stored = self.query_tokens
        missing = [qid for qid in query_ids if stored is None or qid not in stored]
        encoded = iter(())
        if missing:
            dataset = _ViewImages([query_files[qid] for qid in missing], self.query_views, self.image_processor,
                                 self.max_pixels)
            encoded = (self._encode_views(item["views"]) if item["valid"] else None
                       for item in DataLoader(dataset, batch_size=1, num_workers=num_workers, collate_fn=_first))
        for query_id in query_ids:
            if stored is not None and query_id in stored:
                tokens = stored.tokens(query_id)
                yield query_id, None if tokens is None else tokens[None].to(self.device)
            else:
                yield query_id, next(encoded)

    def _reference_lookup(self, reference_ids: list[str], files: dict) -> dict[str, torch.Tensor | None]:
        """id -> the views' tokens (Vr, 1 + L, C) of each reference (``None``: unreadable): read from
        :attr:`reference_tokens` where it holds them, the others through the LRU cache."""
        stored = self.reference_tokens
        found = {} if stored is None else {rid: None if tokens is None else tokens[None].to(self.device)
                                           for rid, tokens in stored.get([r for r in reference_ids
                                                                          if r in stored]).items()}
        others = [rid for rid in reference_ids if rid not in found]
        if others:
            self._reference_tokens(others, files)
            found.update((rid, self._references[rid]) for rid in others)
        return found
