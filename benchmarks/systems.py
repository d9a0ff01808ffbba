"""The benchmark systems: those of :mod:`copynce_hf.evaluation.systems` (one copy, shared with the demo and the CLI)."""

from copynce_hf.evaluation.systems import (
    DescriptorSystem,
    HashSystem,
    MatcherRescoring,
    PipelineSystem,
    SystemOutput,
    pdq_bits,
    phash_bits,
    score_predictions,
)

__all__ = ["SystemOutput", "HashSystem", "pdq_bits", "phash_bits", "DescriptorSystem", "MatcherRescoring",
           "PipelineSystem", "score_predictions"]
