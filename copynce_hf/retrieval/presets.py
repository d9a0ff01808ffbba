"""Named whole settings of ``copynce detect`` / :func:`copynce_hf.retrieval.detection`, and the defaults of
``copynce index`` (no heavy imports, so that the command line can list them in ``--help``).

``paper`` is the authors' inference (their evaluation code, and supplementary "More about
Candidates List for Matcher"): descriptor LCE with their 45 query / 9 reference views and per-group
top-k (up to 390 candidates per query and descriptor), score normalisation over the auxiliary
neighbours of ranks 1-4 (their ``score_normalization.py --start 1 --end 5``, end exclusive), 400
merged candidates, matcher LCE (35 view pairs per candidate), top 10 per query. ``fast`` is sized
for a CPU: whole-image descriptors, 10 candidates, one matcher pass per candidate, ranks 0-9.
``accurate`` spends a few more seconds per query on a CPU: descriptor LCE with the matcher's 26 query / 10
reference views, matcher LCE (35 view pairs) on the top 2, ranks 0-9; chosen over ``fast`` on held-out
training images (BENCHMARKS.md, "A third preset, chosen on held-out images"). ``dedup`` is what ``copynce dedup``
runs with (it has no ``--preset``): ``fast`` with 10 candidates per image.

:class:`CollectionNormalisation` is the collection normalisation that ``detect`` (off by default) and ``dedup`` (on)
share: its fields declare their ``--collection-*`` options (:mod:`copynce_hf.configuration.fields`).
"""

from __future__ import annotations

import dataclasses

from ..configuration.fields import non_negative_int, on_off, setting
from ..modeling.errors import ConfigError

#: Merged candidates per query handed to the matcher by default: practical on a CPU (the paper: 400 on GPUs). Chosen on
#: development draws of ``train`` photos (plain copies, lone framed queries, the template detection task) by the rule
#: written before them: the fewest of 50, 30, 20 and 10 within 0.005 muAP of 50 on each (benchmarks/LOG.md, "Fewer
#: candidates, bfloat16 fusion and the speed of detect", and "Detect within 35 seconds", which applies it as written).
DEFAULT_CANDIDATES = 10

#: References a layout crop's descriptor proposes at most (its nearest) in ``detect``'s query crops: a layout box is a
#: guess, which the descriptor checks. Chosen on the same development draws: the fewest of 5, 3, 2 and 1 within 0.005
#: muAP of 5 on each; 1 was above 5 on all four (benchmarks/LOG.md, "Detect within 35 seconds").
DEFAULT_LAYOUT_CANDIDATES = 1

#: Candidate pairs per chunk of re-scoring work (:mod:`.chunked_scoring`): a few seconds of GPU work, a small file.
DEFAULT_CHUNK_SIZE = 10_000

#: Images per chunk of resumable indexing (:mod:`.chunked_extraction`, ``copynce index --chunk-size``).
DEFAULT_INDEX_CHUNK_SIZE = 10_000

#: The ranks of an image's neighbours among the other images of its collection (0-based, inclusive: the 3rd to the
#: 10th nearest) averaged into its background by collection normalisation (:mod:`.background`): a true group of
#: two or three copies sits at ranks 0-1 and does not discount itself.
COLLECTION_K_START, COLLECTION_K_END = 2, 9

#: Content tokens (:mod:`copynce_hf.retrieval.content.tokens`): the cosine above which two of the matcher's encoder
#: tokens (and of the descriptor's final-layer patch tokens) match, and a token matched in ``MIN_IMAGES`` of an image's
#: ``NEIGHBOURS`` nearest images is dropped (chosen on held-out ``train`` images: benchmarks/LOG.md, "Content over
#: frame").
MATCHER_TAU = 0.8
DESCRIPTOR_TAU = 0.6
MIN_IMAGES = 2
NEIGHBOURS = 10

#: How many times ``copynce dedup``'s matcher scores each pair (``DedupSettings.matcher_orders``): ``auto`` (both
#: orders when the matcher's score depends on which image is the query, once otherwise), in both orders (each image
#: the query once, the mean logit decides) or once (the earlier image as the query).
MATCHER_ORDERS = ("auto", "both", "one")

#: How the matcher's fusion blocks compute (:func:`~copynce_hf.retrieval.verify.scorer.resolve_fusion_precision`):
#: ``float32``, ``bfloat16`` (autocast: matrix products in bfloat16, softmax, normalisations and the classifier in
#: float32) or ``auto`` (bfloat16 where the device multiplies it natively: a CUDA device that supports it, a CPU with
#: AVX-512 bfloat16 kernels; float32 elsewhere and for ONNX Runtime graphs). The encoder follows :data:`ENCODER_PRECISIONS`.
FUSION_PRECISIONS = ("auto", "float32", "bfloat16")
#: The fusion precision every command and scoring call uses unless told otherwise.
DEFAULT_FUSION_PRECISION = "auto"

#: How ``copynce detect``'s descriptors and the matcher's encoder compute (:func:`~copynce_hf.precision.
#: accelerate_precision`, accelerate's mixed precision): ``float32``, ``bfloat16`` (autocast) or ``auto`` (what
#: ``accelerate launch --mixed_precision`` or ``ACCELERATE_MIXED_PRECISION`` chose, else bfloat16 where the device
#: multiplies it natively); the fusion blocks follow :data:`FUSION_PRECISIONS` whatever it is. ``auto`` was chosen on
#: development draws: within 0.005 muAP of float32 on each (benchmarks/LOG.md, "Detect within 35 seconds").
ENCODER_PRECISIONS = FUSION_PRECISIONS
DEFAULT_ENCODER_PRECISION = "auto"

#: Where ``copynce detect`` measures each reference's background: among the other references (``collection``)
#: or among the auxiliary images (``auxiliary``, needs them).
REFERENCE_BACKGROUNDS = ("collection", "auxiliary")

#: :class:`~copynce_hf.retrieval.DetectConfig` fields a preset sets.
DETECT_PRESET_FIELDS = ("descriptor_lce", "matcher_lce", "candidates", "k", "alpha", "k_start", "k_end",
                        "content_tokens", "query_crops")

#: Preset name -> values of :data:`DETECT_PRESET_FIELDS`.
DETECT_PRESETS: dict[str, dict] = {
    "fast": {"descriptor_lce": "none", "matcher_lce": "none", "candidates": DEFAULT_CANDIDATES, "k": 10,
             "alpha": 1.0, "k_start": 0, "k_end": 9, "content_tokens": True,
             "query_crops": True},
    "accurate": {"descriptor_lce": "matcher-views", "matcher_lce": "paper", "candidates": 2, "k": 10,
                 "alpha": 1.0, "k_start": 0, "k_end": 9, "content_tokens": False,
                 "query_crops": False},
    "paper": {"descriptor_lce": "authors", "matcher_lce": "paper", "candidates": 400, "k": 10,
              "alpha": 1.0, "k_start": 1, "k_end": 4, "content_tokens": False,
              "query_crops": False},
}

#: ``copynce dedup``'s settings of the detection pipeline (:class:`~copynce_hf.retrieval.DetectConfig`), by name.
DEDUP_PRESETS: dict[str, dict] = {"dedup": {**DETECT_PRESETS["fast"], "candidates": 10}}

#: Every preset :meth:`~copynce_hf.retrieval.DetectConfig.from_preset` knows.
PIPELINE_PRESETS: dict[str, dict] = {**DETECT_PRESETS, **DEDUP_PRESETS}


def check_ranks(k_start: int, k_end: int, what: str = "collection normalisation") -> None:
    """Refuse ranks that are not ``0 <= k_start <= k_end`` (one :class:`ConfigError` naming both)."""
    if not 0 <= int(k_start) <= int(k_end):
        raise ConfigError(f"{what} needs 0 <= k_start <= k_end, got k_start={k_start}, k_end={k_end}")


@dataclasses.dataclass(frozen=True)
class CollectionNormalisation:
    """Collection normalisation: descriptor scores lose what an image shares with many images of its collection (a
    template, a frame, a meme band: :mod:`copynce_hf.retrieval.search.background`).

    An image's background is its mean cosine to its neighbours of 0-based ranks ``k_start..k_end`` (inclusive) among
    the other images of its collection. ``detect`` subtracts ``alpha`` times each reference's background from every
    query->reference score before the candidates are chosen, out of each query's ``2 * candidates`` nearest (with a
    matcher it changes which candidates are verified, not their scores);
    ``dedup`` subtracts ``alpha`` times the mean of a pair's two backgrounds (CSLS). ``detect``'s is off by default
    (:class:`~copynce_hf.retrieval.DetectConfig`), ``dedup``'s on
    (:class:`~copynce_hf.retrieval.deduplication.settings.DedupSettings`).
    """

    on: bool = setting(False, (
        "on: descriptor scores lose what an image shares with many images of its collection before candidates are "
        "chosen, an image's background being its mean cosine to its neighbours of ranks "
        "--collection-k-start..--collection-k-end among the other images; detect: every query->reference score loses "
        "its reference's background, which keeps references sharing a template out of the query's best candidates "
        "(off by default: content tokens recognise the template in the verified candidates); dedup: each pair's "
        "score loses the mean of its two images' backgrounds"), flag="--collection-normalisation", type=on_off, metavar="{on,off}")
    alpha: float = setting(1.0, "weight of the background", flag="--collection-alpha", type=float, metavar="A")
    k_start: int = setting(COLLECTION_K_START, "first neighbour rank averaged, from 0", flag="--collection-k-start",
                           type=non_negative_int, metavar="N", default_text=(
                               f"(default {COLLECTION_K_START}: the best two, a small true group of copies, are left "
                               "out)"))
    k_end: int = setting(COLLECTION_K_END, "last neighbour rank averaged, inclusive", flag="--collection-k-end",
                         type=non_negative_int, metavar="N")

    def __post_init__(self) -> None:
        check_ranks(self.k_start, self.k_end)
