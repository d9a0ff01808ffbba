"""Named whole settings of ``copynce detect`` / :func:`copynce_hf.retrieval.detection`, and the defaults of
``copynce index`` (no heavy imports, so that the command line can list them in ``--help``).

``paper`` is the authors' inference (their evaluation code, and supplementary "More about
Candidates List for Matcher"): descriptor LCE with their 45 query / 9 reference views and per-group
top-k (up to 390 candidates per query and descriptor), score normalisation over the auxiliary
neighbours of ranks 1-4 (their ``score_normalization.py --start 1 --end 5``, end exclusive), 400
merged candidates, matcher LCE (35 view pairs per candidate), top 10 per query. ``fast`` is sized
for a CPU: whole-image descriptors, 50 candidates, one matcher pass per candidate, ranks 0-9.
``accurate`` spends a few more seconds per query on a CPU: descriptor LCE with the matcher's 26 query / 10
reference views, matcher LCE (35 view pairs) on the top 2, ranks 0-9; chosen over ``fast`` on held-out
training images (BENCHMARKS.md, "A third preset, chosen on held-out images").
"""

from __future__ import annotations

#: Merged candidates per query handed to the matcher by default: practical on a CPU (the paper: 400 on GPUs).
DEFAULT_CANDIDATES = 50

#: Candidate pairs per chunk of re-scoring work (:mod:`.chunked_scoring`): a few seconds of GPU work, a small file.
DEFAULT_CHUNK_SIZE = 10_000

#: Images per chunk of resumable indexing (:mod:`.chunked_extraction`, ``copynce index --chunk-size``).
DEFAULT_INDEX_CHUNK_SIZE = 10_000

#: The ranks of an image's neighbours among the other images of its collection (0-based, inclusive: the 3rd to the
#: 10th nearest) averaged into its background by collection normalisation (:mod:`.background`): a true group of
#: two or three copies sits at ranks 0-1 and does not discount itself.
COLLECTION_K_START, COLLECTION_K_END = 2, 9

#: How many times ``copynce dedup``'s matcher scores each pair (``DedupSettings.matcher_orders``): ``auto`` (both
#: orders when the matcher's score depends on which image is the query, once otherwise), in both orders (each image
#: the query once, the mean logit decides) or once (the earlier image as the query).
MATCHER_ORDERS = ("auto", "both", "one")

#: Where ``copynce detect`` measures each reference's background: among the other references (``collection``)
#: or among the auxiliary images (``auxiliary``, needs them).
REFERENCE_BACKGROUNDS = ("collection", "auxiliary")

#: :class:`~copynce_hf.retrieval.DetectConfig` fields of collection normalisation (no preset sets them; given on the
#: command line they override the defaults as a preset's fields are overridden).
COLLECTION_FIELDS = ("collection_normalisation", "collection_alpha", "collection_k_start", "collection_k_end",
                     "reference_background")

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
