"""Where the time of a ``copynce detect`` or ``copynce dedup`` run goes: a pyinstrument profile summed by stage and by
operation.

    python -m benchmarks.speed.profile RUN.pyisession            # the two tables of a saved profile
    python -m benchmarks.speed.pipeline --profile                     # profiles each timed run (pip install pyinstrument)

pyinstrument samples the main thread's stack every few milliseconds (torch's intra-op threads work inside the calls
of the main thread, so their time is that of the call that waits for them). Each sample's time goes to

* its **stage**: the path of the pipeline functions on its stack, outermost first (:data:`STAGES`: a function name
  and the stage it starts), e.g. ``self-calibration > content crops > crop pairs > matcher``: the matcher scoring the
  content crops' pairs inside dedup's self-calibration; samples outside every stage are the command's start (the
  imports) and end;
* its **operation**: the innermost of :data:`OPERATIONS` on its stack (image decoding, the matcher's encoder or
  fusion blocks, the content-token matches, ...), ``other`` where none is.

Functions are matched by name (a class name where the name alone is ambiguous), so the tables survive a module
being moved; a stage whose function is renamed falls into its caller's stage.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

__all__ = ["STAGES", "OPERATIONS", "stage_tables", "print_tables", "main"]

#: function name -> the stage its call starts (the pipeline's stages, in ``copynce_hf.retrieval``).
STAGES = {
    "self_calibrate": "self-calibration", "synthetic_set": "synthetic copies",
    "load_descriptors": "model loading", "load_matcher": "model loading", "learn_whitening": "whitening",
    "view_index": "descriptor index", "query_view_descriptors": "query descriptors",
    "search_references": "search", "descriptor_candidates": "search", "self_search_pairs": "self-search",
    "detect_content_search": "descriptor content",
    "reference_background": "reference background", "matcher_scores": "matcher", "_verified": "matcher",
    "token_store": "token store", "_token_stores": "token store",
    "dedup_keep_masks": "content tokens", "sharded_matches": "content tokens", "query_crops": "query crops",
    "content_crops": "content crops", "view_scores": "crop pairs", "score_missing": "missing group scores",
    "decision": "matcher normalisation", "group_members": "grouping", "extract_descriptors": "descriptors",
    "write_gallery": "report.html", "write_group_gallery": "report.html", "write_detect_data": "data files",
    "write_groups": "data files", "write_pairs": "data files", "write_crops": "data files",
}
#: ``(function name, class name or None, operation)``, the first match of a frame naming its operation.
OPERATIONS = (
    ("_find_and_load", None, "imports"), ("load_image", None, "image decoding"),
    ("pre_fusion_tokens", None, "matcher encoder"), ("fuse", None, "matcher fusion"),
    ("fusion_logits", None, "matcher fusion"), ("layout_boxes", None, "layout boxes"),
    ("fuse_kept", None, "matcher fusion"), ("local_keep_masks", None, "content-token matches"),
    ("matched_in", None, "content-token matches"), ("pair_keep", None, "content-token matches"),
    ("unit_patch_tokens", None, "content-token matches"), ("forward", "CopyNCEDescriptorModel", "descriptor forward"),
    ("encode", "CopyNCEDescriptorModel", "descriptor forward"), ("content_descriptors", None, "descriptor forward"),
    ("preprocess", None, "image processor"), ("__call__", "CopyNCEImageProcessor", "image processor"),
    ("save_file", None, "token files"), ("tensor", "_ChunkFile", "token files"), ("apply", "CopyRecipe", "pixel edits"),
    ("from_pretrained", None, "model loading"), ("search", "DescriptorIndex", "faiss search"),
)
#: The stage of the samples outside every stage.
OUTSIDE = "(outside the stages: start, imports, exit)"


def _operation(frame, current: str) -> str:
    for function, owner, operation in OPERATIONS:
        if frame.function == function and (owner is None or frame.class_name == owner):
            return operation
    return current


def stage_tables(session_file) -> dict:
    """``{"seconds": total, "stages": {path: {"seconds", "operations": {operation: seconds}}}, "operations":
    {operation: seconds}}`` of a saved pyinstrument session (``-r pyisession``)."""
    from pyinstrument.session import Session

    session = Session.load(str(session_file))
    stages: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    stack = [(session.root_frame(trim_stem=False), (), "other")]
    while stack:
        frame, path, operation = stack.pop()
        stage = STAGES.get(frame.function)
        if stage and (not path or path[-1] != stage):
            path = path + (stage,)
        operation = _operation(frame, operation)
        if not frame.is_synthetic:  # a synthetic "[self]" child repeats its parent's own time
            stages[" > ".join(path) or OUTSIDE][operation] += frame.total_self_time
        stack.extend((child, path, operation) for child in frame.children)
    operations: dict[str, float] = defaultdict(float)
    for found in stages.values():
        for operation, seconds in found.items():
            operations[operation] += seconds
    return {"seconds": session.duration,
            "stages": {path: {"seconds": sum(found.values()), "operations": dict(found)}
                       for path, found in sorted(stages.items(), key=lambda item: -sum(item[1].values()))},
            "operations": dict(sorted(operations.items(), key=lambda item: -item[1]))}


def print_tables(tables: dict, least: float = 0.2) -> None:
    """The two Markdown tables (stages of at least ``least`` seconds)."""
    total = sum(found["seconds"] for found in tables["stages"].values()) or 1.0
    print(f"profiled {tables['seconds']:.1f} s\n\n| stage | s | share | operations (s) |\n|---|---|---|---|")
    for path, found in tables["stages"].items():
        if found["seconds"] >= least:
            operations = ", ".join(f"{name} {seconds:.1f}" for name, seconds in sorted(
                found["operations"].items(), key=lambda item: -item[1]) if seconds >= 0.1)
            print(f"| {path} | {found['seconds']:.1f} | {found['seconds'] / total:.1%} | {operations} |")
    print("\n| operation | s | share |\n|---|---|---|")
    for name, seconds in tables["operations"].items():
        print(f"| {name} | {seconds:.1f} | {seconds / total:.1%} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speed.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("session", help="a pyinstrument session file (pyinstrument -r pyisession -o FILE ...)")
    print_tables(stage_tables(parser.parse_args(argv).session))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
