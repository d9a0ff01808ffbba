"""Tests of the DISC21-scale benchmark (benchmarks/scale/disc21.py) and the GPU throughput script
(benchmarks/scale/gpu_throughput.py, run here on the CPU with tiny sizes)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.scale import gpu_throughput
from benchmarks.scale.disc21 import (
    PUBLISHED_VITS16_IMAGES_PER_SECOND,
    bench_faiss_scale,
    disc21_estimate,
    disc21_scenarios,
    disc21_workload,
    gpu_rates,
    index_quality,
    markdown_tables,
    paper_preset_counts,
    synthetic_descriptors,
)
from benchmarks.scale.disc21 import main as scale_main
from copynce_hf.data import ASSET_IMAGES


def test_synthetic_descriptors_are_clustered_and_copies_beat_close_rivals():
    references, queries, sources = synthetic_descriptors(4000, 400, seed=3)
    assert references.shape == (4000, 512) and queries.shape == (400, 512)
    assert references.dtype == np.float32 and queries.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(references, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(queries, axis=1), 1.0, atol=1e-5)
    copies = sources >= 0
    assert copies[:80].all() and not copies[80:].any()  # DISC21's 20 %, copies first
    similarity = queries[copies] @ references.T
    to_source = similarity[np.arange(copies.sum()), sources[copies]]
    assert 0.45 < to_source.mean() < 0.65
    similarity[np.arange(copies.sum()), sources[copies]] = -1.0
    rival = similarity.max(axis=1)
    # Not a trivially uniform cloud: the best rival is close (a thousand-reference cluster), the source closer.
    assert rival.mean() > 0.4 and (to_source > rival).all()
    assert (references[:1000] @ references[:1000].T).mean() > 0.15  # uniform unit vectors: about 0
    again = synthetic_descriptors(4000, 400, seed=3)
    np.testing.assert_array_equal(again[1], queries)


def test_index_quality_counts_copies_sources_and_agreement():
    sources = np.array([5, 7, -1, 2])
    found = np.array([[5, 1, 2], [1, 7, 3], [4, 5, 6], [9, 8, -1]])
    exact = np.array([[5, 1, 2], [7, 1, 3], [4, 5, 6], [2, 8, 9]])
    quality = index_quality(found, sources, exact)
    assert quality["copy_queries"] == 3 and quality["k"] == 3
    assert quality["found_at_1"] == pytest.approx(1 / 3)
    assert quality["source_recall_at_k"] == pytest.approx(2 / 3)
    assert quality["top1_agreement"] == pytest.approx(2 / 4)
    assert quality["overlap_at_10"] == pytest.approx((3 + 3 + 3 + 2) / 12)
    with pytest.raises(ValueError, match="no copy query"):
        index_quality(found, np.full(4, -1))


def test_bench_faiss_scale_measures_the_package_indexes_in_child_processes(tmp_path):
    saved = []
    entry = bench_faiss_scale(1500, tmp_path, num_queries=100, k=20, kinds=("ivfpq",), seed=1, exact_queries=50,
                              on_result=lambda e: saved.append(sorted(e["indexes"])))
    assert saved == [["flat"], ["flat", "ivfpq"]]
    flat, ivfpq = entry["indexes"]["flat"], entry["indexes"]["ivfpq"]
    assert flat["factory"] == "Flat" and ivfpq["factory"].startswith("IVF") and "PQ256x4fs" in ivfpq["factory"]
    assert flat["searched_queries"] == 50 and ivfpq["searched_queries"] == 100
    assert flat["search_cpu_seconds"] == pytest.approx(2 * flat["search_cpu_seconds_measured"])
    assert flat["found_at_1"] == 1.0 and flat["faiss_threads"] == 1
    assert 0.5 < ivfpq["found_at_1"] <= 1.0 and 0.5 < ivfpq["top1_agreement"] <= 1.0
    assert ivfpq["peak_resident_mib"] >= ivfpq["resident_mib_data_loaded"] > 0
    assert not list(tmp_path.glob("data-*.npz"))  # the descriptors are removed after the run
    table = markdown_tables({"parts": {"faiss": {"sizes": {"1500": entry}}}})
    assert "| 1,500 | flat (`Flat` ) |" in table and "(50 run)" in table


def test_bench_faiss_scale_hnsw_settings_reach_the_child_and_its_row(tmp_path):
    entry = bench_faiss_scale(1500, tmp_path, num_queries=40, k=200, kinds=("hnsw",), seed=1,
                              hnsw_settings={"ef_construction": 40, "ef_search": 64})
    hnsw = entry["indexes"]["hnsw"]
    assert hnsw["settings"] == {"ef_construction": 40, "ef_search": 64}
    assert hnsw["search_parameters"] == "efConstruction=40, efSearch=200"  # the beam widened to k = 200
    assert entry["indexes"]["flat"]["settings"] == {}
    assert "efConstruction=40, efSearch=200" in markdown_tables({"parts": {"faiss": {"sizes": {"1500": entry}}}})


def test_disc21_workload_uses_the_paper_preset_counts():
    counts = paper_preset_counts()
    assert counts == {"candidates": 400, "descriptor_query_views": 45, "descriptor_reference_views": 9,
                      "matcher_query_views": 26, "matcher_reference_views": 10, "view_pairs": 35}
    workload = disc21_workload(**counts)
    assert workload["matcher_pairs"] == 20_000_000  # 50,000 queries x 400 candidates
    assert workload["fusion_passes"] == 700_000_000
    assert workload["descriptor_passes"] == 2_000_000 * 9 + 50_000 * 45
    assert workload["encoder_passes"] == 50_000 * 26 + 20_000_000 * 10
    assert workload["encoder_passes_each_view_once"] == 50_000 * 26 + 1_000_000 * 10


def test_disc21_estimate_from_measured_costs_and_a_gpu_rate():
    workload = disc21_workload(references=1000, queries=10, auxiliary=0, candidates=4)
    cpu = {"descriptor_seconds_per_image": 0.1, "encoder_seconds_per_view": 0.05, "fusion_seconds_per_pair": 0.2}
    gpu = {"descriptor_images_per_second": 100.0, "encoder_views_per_second": 200.0,
           "fusion_pairs_per_second": 50.0, "source": "test"}
    estimate = disc21_estimate(workload, cpu, gpu, flat_seconds_per_row_pair=1e-9)
    one_gpu = (workload["descriptor_passes"] / 100 + workload["encoder_passes"] / 200
               + workload["fusion_passes"] / 50) / 3600
    assert estimate["gpu_hours_total"]["1"] == pytest.approx(one_gpu)
    assert estimate["gpu_hours_total"]["64"] == pytest.approx(one_gpu / 64)
    assert estimate["cpu_core_hours"]["matcher fusion"] == pytest.approx(workload["fusion_passes"] * 0.2 / 3600)
    search_cpu = 450 * 9000 * 1e-9 / 3600  # 10 queries x 45 views against 1000 x 9 views
    assert estimate["cpu_core_hours"]["exact search"] == pytest.approx(search_cpu)
    assert estimate["cpu_core_hours"]["total"] == pytest.approx(
        (workload["descriptor_passes"] * 0.1 + workload["encoder_passes"] * 0.05 + workload["fusion_passes"] * 0.2)
        / 3600 + search_cpu)
    assert "exact search" not in estimate["one_gpu_hours"]  # no GPU search rate given
    with_search = disc21_estimate(workload, cpu, {**gpu, "search_row_pairs_per_second": 1e3})
    assert with_search["one_gpu_hours"]["exact search"] == pytest.approx(450 * 9000 / 1e3 / 3600)
    assert with_search["gpu_hours_total"]["8"] == pytest.approx((one_gpu + 450 * 9000 / 1e3 / 3600) / 8)
    published = disc21_estimate(workload, cpu)
    assert published["gpu"]["descriptor_images_per_second"] == PUBLISHED_VITS16_IMAGES_PER_SECOND
    # encoder and fusion: the published rate times the CPU-measured cost ratio to a descriptor pass
    assert published["gpu"]["fusion_pairs_per_second"] == pytest.approx(PUBLISHED_VITS16_IMAGES_PER_SECOND / 2)
    assert "Touvron" in published["gpu"]["source"]


def test_disc21_scenarios_price_the_paper_preset_and_whole_images():
    scenarios = disc21_scenarios()
    assert scenarios["paper LCE"] == disc21_workload(**paper_preset_counts())
    plain = scenarios["no LCE"]
    assert plain["matcher_pairs"] == 20_000_000 and plain["fusion_passes"] == 20_000_000
    assert plain["descriptor_passes"] == 2_000_000 + 50_000  # references and auxiliary images, then queries
    assert plain["encoder_passes"] == 50_000 + 20_000_000  # the token cache: each query once, each candidate new
    assert plain["search_query_rows"] == 50_000 and plain["search_index_rows"] == 2_000_000


def gpu_record(**parts) -> dict:
    """A gpu_throughput.json record as benchmarks.scale.gpu_throughput writes it (the fields the estimate reads)."""
    record = {"device": "NVIDIA H200", "precision": "bf16", "created": "2026-11-27T02:58:43+00:00",
              "machine": {"torch": "2.11.0+cu130"},
              "inference": {"descriptor_images_per_second": 19224.0, "encoder_views_per_second": 27011.0,
                            "fusion_pairs_per_second": 31027.0, "cached_pairs_per_second": 14421.0},
              "search": {"row_pairs_per_second": 3.19e10}}
    return {**record, **parts}


def test_gpu_rates_read_a_gpu_throughput_record_and_refuse_an_incomplete_one():
    rates = gpu_rates(gpu_record(), "run/gpu_throughput.json")
    assert rates["descriptor_images_per_second"] == 19224.0 and rates["fusion_pairs_per_second"] == 31027.0
    assert rates["search_row_pairs_per_second"] == 3.19e10
    assert "NVIDIA H200" in rates["source"] and "2026-11-27" in rates["source"]
    assert "run/gpu_throughput.json" in rates["source"]
    incomplete = gpu_record()
    del incomplete["search"]  # a call cut short after the inference part
    with pytest.raises(ValueError, match="cut.json is not a complete gpu_throughput.json: it lacks search"):
        gpu_rates(incomplete, "cut.json")


def test_estimate_part_tables_each_scenario_from_the_measured_gpu(tmp_path):
    models = {"vits16-224": {"descriptor_seconds_per_image": 0.197, "encoder_seconds_per_view": 0.1365,
                             "fusion_seconds_per_pair": 0.1482, "uncached_seconds_per_pair": 0.3788}}
    faiss = {"sizes": {"1000000": {"references": 1_000_000, "queries": 50_000,
                                   "indexes": {"flat": {"search_cpu_seconds": 842.0}}}}}
    (tmp_path / "scale.json").write_text(json.dumps({"parts": {"models": {"models": models}, "faiss": faiss}}))
    (tmp_path / "gpu.json").write_text(json.dumps(gpu_record()))
    record = scale_main(["--parts", "estimate", "--output-dir", str(tmp_path), "--gpu-json", str(tmp_path / "gpu.json")])
    scenarios = record["parts"]["estimate"]["scenarios"]
    paper, plain = scenarios["paper LCE"], scenarios["no LCE"]
    assert paper["one_gpu_hours"]["matcher fusion"] == pytest.approx(700_000_000 / 31027.0 / 3600)
    assert plain["one_gpu_hours"]["exact search"] == pytest.approx(50_000 * 2_000_000 / 3.19e10 / 3600)
    assert plain["cpu_core_hours"]["exact search"] == pytest.approx(50_000 * 2_000_000 * 842.0 / 5e10 / 3600)
    table = markdown_tables({"parts": {"estimate": record["parts"]["estimate"]}})
    assert "**paper LCE**" in table and "**no LCE**" in table and "measured on one NVIDIA H200" in table
    assert "| 64 | 8.4 min | 6.6 min |" in table  # 8.98 and 7.03 hours on one GPU


def test_gpu_throughput_script_runs_on_the_cpu_with_tiny_sizes(tmp_path):
    record = gpu_throughput.main([
        "--device", "cpu", "--image-size", "32", "--batch-size", "2", "--repeats", "1", "--candidates", "4",
        "--search-references", "300", "--search-queries", "8", "--k", "5", "--train-steps", "1",
        "--train-batch", "2", "--workers", "0", "--loader-batches", "1", "--image-folder", str(ASSET_IMAGES),
        "--output-dir", str(tmp_path)])
    saved = json.loads((tmp_path / "gpu_throughput.json").read_text())
    assert saved["device"] == "cpu" and saved["precision"] == "bf16"
    inference = saved["inference"]
    for key in ("descriptor_images_per_second", "encoder_views_per_second", "fusion_pairs_per_second",
                "cached_pairs_per_second", "paper_lce_candidates_per_second", "uncached_pairs_per_second"):
        assert inference[key] > 0, key
    # the cache's pair costs one fusion, one reference encoding and a share of the query's
    assert inference["cached_pairs_per_second"] < inference["fusion_pairs_per_second"]
    assert saved["search"]["k"] == 5 and saved["search"]["queries_per_second"] > 0
    configs = saved["training"]["configs"]
    assert set(configs) == set(gpu_throughput.TRAINING_CONFIGS)
    for entry in configs.values():
        assert entry["pairs_per_step"] == 2 and entry["steps_per_second"] > 0
        assert entry["loader_pairs_per_second"]["0"] > 0
    assert configs["matcher_vits16_224.yaml"]["query_recipe"] == "paper_matcher"
    report = (tmp_path / "gpu_throughput.md").read_text()
    assert "matcher pairs with the token cache" in report and "steps/s" in report
    assert record["inference"]["costs"]["descriptor"]["image_size"] == 32
