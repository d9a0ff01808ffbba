"""Packaging for copynce_hf: CopyNCE image copy detection for the Hugging Face ecosystem."""

from pathlib import Path

from setuptools import find_packages, setup

README = Path(__file__).with_name("README.md")

setup(
    name="copynce_hf",
    version="0.1.0.dev0",
    description="CopyNCE image copy detection (ICCV 2025): PixTrace, descriptor and matcher models, "
    "training, retrieval and the muAP metric, built on the Hugging Face ecosystem.",
    long_description=README.read_text(encoding="utf-8") if README.exists() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    # The card templates and the training configurations live in the repository's model_cards/ and
    # configs/ and ship as copynce_hf/model_cards/ and copynce_hf/configs/ (read at run time).
    packages=find_packages(include=["copynce_hf", "copynce_hf.*"]) + ["copynce_hf.model_cards", "copynce_hf.configs"],
    package_dir={"copynce_hf.model_cards": "model_cards", "copynce_hf.configs": "configs"},
    include_package_data=True,
    package_data={
        "copynce_hf": [
            "assets/*",
            "assets/**/*",
            "pretrained/**/*",
            "metrics/copy_detection/*",
            "py.typed",
        ],
        "copynce_hf.model_cards": ["*.md"],
        "copynce_hf.configs": ["*.yaml"],
    },
    install_requires=[
        "numpy>=1.24",
        "pillow>=9.5",
        "augly>=1.0.0",
        "opencv-python-headless>=4.10",  # fused PixTrace warps (copynce_hf.pixtrace.fused)
        # Floors: what transformers 5.24 itself requires (torch 2.6, huggingface_hub 1.31, safetensors 0.8,
        # accelerate 1.1); datasets 4.2 is the first release that accepts huggingface_hub 1.x.
        "torch>=2.6,<2.15",
        "transformers>=5.24,<6",
        "accelerate>=1.1",
        "datasets>=4.2",
        # StatefulDataLoader (with snapshot_every_n_steps): the exact resume of streamed runs.
        "torchdata>=0.8",
        "evaluate>=0.4.1",
        "huggingface_hub>=1.31",
        "safetensors>=0.8",
        "faiss-cpu>=1.7.4",
        "pyyaml>=6",
        "jinja2>=3",
        "tqdm>=4.60",
        "matplotlib>=3.7",
    ],
    extras_require={
        # tensorboard: the default tracker of scripts/train.py (report_to), which the tests run;
        # albumentations: the paper recipes the tests draw (the "train" extra). Extras the tests only
        # touch in places (bench, space, onnx) make those tests skip, naming the extra (fail in CI).
        "dev": ["pytest>=7", "ruff>=0.4", "pytest-timeout>=2.1", "pytest-xdist>=3.5", "tensorboard>=2.14",
                "albumentations>=2.0"],
        "bench": ["pdqhash>=0.2", "imagehash>=4.3", "tensorboard>=2.14", "h5py>=3.8", "pyinstrument>=4.6"],
        # The authors' recipes (CopyRecipe.paper_descriptor / paper_matcher) draw their "additional"
        # photometric family from albumentations (set_random_seed: 2.0); it brings OpenCV, not torch.
        "train": ["albumentations>=2.0"],
        # the Space (spaces/copynce/app.py) and its browser test (Playwright drives the system's chromium)
        "space": ["gradio>=6,<7", "playwright>=1.40"],
        # scripts/check_against_authors.py imports the authors' model and loss code (GitHub eddielyc/CopyNCE):
        # what it needs beyond this package, none of which pulls torch (timm, torchvision and kornia get
        # stand-ins from copynce_hf.fidelity.standins).
        # copynce export-onnx (torch.onnx.export's dynamo exporter writes through onnxscript) and --runtime onnx
        "onnx": ["onnx>=1.17", "onnxscript>=0.3", "onnxruntime>=1.20"],
        "authors": ["loguru>=0.7", "einops>=0.6", "omegaconf>=2.3", "opencv-python-headless>=4.8"],
    },
    entry_points={"console_scripts": ["copynce=copynce_hf.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Image Recognition",
    ],
)
