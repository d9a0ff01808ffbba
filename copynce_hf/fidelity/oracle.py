"""The authors' CopyNCE code as an oracle for this package (``scripts/check_against_authors.py``).

:func:`run_checks` imports the authors' model and loss code from a checkout of GitHub
``eddielyc/CopyNCE`` (nothing of it is copied here), builds their descriptor and matcher from their
default configurations (ViT-S/16, 224) with seeded random weights (their initialisation, then every
tensor, biases, norms and batch-norm statistics included, moved by seeded noise so each one matters),
saves them with their ``Checkpointer``, converts the files with
:func:`copynce_hf.authors_checkpoints.convert_authors_checkpoint` and compares, in float32, on the
bundled images:

* their evaluation transform with this package's image processor (pixel values);
* descriptors, the matcher's copy logits and probabilities, and the token maps CopyNCE reads;
* their CopyNCE, InfoNCE and KoLeo losses (and the matcher's BCE and CopyNCE) with this package's
  on one training batch made of the same tensors; the overlap priors are made by this package's
  PixTrace (:func:`copynce_hf.pixtrace.patch_overlap`) from the query -> reference pixel maps their
  loss derives (with their ``MaskMapper``) from the batch's query -> original and reference ->
  original maps.

Their code imports timm, torchvision and kornia: where those are absent (a torchvision built for
another torch cannot be imported beside this CPU torch) :mod:`.standins` provides the few names it
takes from them. Their ``core.data`` packages are registered without running their ``__init__``
(which import the whole training data pipeline), so only the one data file the CopyNCE loss needs
(``mask_mapper.py``) is loaded. Everything runs on the CPU: their ``MaskMapper`` moves tensors
with ``.cuda()``, which is the identity while their loss runs. Their InfoNCE and KoLeo gather over
``torch.distributed``, so a one-process gloo group is started.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..authors_checkpoints import convert_authors_checkpoint
from ..modeling import CopyNCEDescriptorModel, CopyNCEImageProcessor, CopyNCEMatcherModel
from ..modeling.errors import CopyNCEError
from ..pixtrace import CoordinateTable, patch_overlap
from .standins import install_standins

__all__ = ["Row", "checkpoint_layout", "format_table", "run_checks"]

#: The limits: outputs within 1e-5 (max abs), losses within 1e-5 (relative).
OUTPUT_LIMIT = 1e-5
LOSS_LIMIT = 1e-5


@dataclass
class Row:
    """One comparison: ``measured`` (max abs or relative difference) against ``limit``; ``scale`` is
    the size of the compared values (max abs of theirs, or their loss)."""

    check: str
    measure: str
    measured: float
    limit: float
    scale: float

    @property
    def holds(self) -> bool:
        return bool(self.measured <= self.limit)


def format_table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    lines = ["| check | their values (max abs / loss) | measure | difference | limit | holds |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row.check} | {row.scale:.4g} | {row.measure} | {row.measured:.2e} | {row.limit:.2g} | "
                     f"{'yes' if row.holds else 'NO'} |")
    return "\n".join(lines)


def _output_row(check: str, ours: torch.Tensor, theirs: torch.Tensor) -> Row:
    """Max abs difference of two outputs (NaN anywhere fails the row)."""
    if ours.shape != theirs.shape:
        raise CopyNCEError(f"{check}: shapes differ: ours {tuple(ours.shape)}, theirs {tuple(theirs.shape)}")
    difference = float((ours.double() - theirs.double()).abs().max())
    return Row(check, "max abs", difference, OUTPUT_LIMIT, float(theirs.double().abs().max()))


def _loss_row(check: str, ours: torch.Tensor, theirs: torch.Tensor) -> Row:
    """Relative difference of two losses; a zero loss of theirs fails the row (nothing would be compared)."""
    theirs = theirs.double()
    difference = float((ours.double() - theirs).abs() / theirs.abs()) if float(theirs) != 0 else math.inf
    return Row(check, "relative", difference, LOSS_LIMIT, float(theirs))


# ----------------------------------------------------------------------------------- their code
def _import_authors_code(directory: Path) -> types.SimpleNamespace:
    """Their modules, imported from ``directory`` (a checkout of eddielyc/CopyNCE)."""
    directory = Path(directory).resolve()
    if not (directory / "core" / "models" / "build.py").is_file():
        raise CopyNCEError(f"{directory} is not a checkout of eddielyc/CopyNCE (core/models/build.py not found)")
    loaded = sys.modules.get("core")
    if loaded is not None and Path(loaded.__file__).resolve().parent != directory / "core":
        raise CopyNCEError(f"another package named 'core' is already imported ({loaded.__file__})")
    install_standins()
    sys.path.insert(0, str(directory))
    for package in ("core.data", "core.data.augmentation"):  # their __init__ imports the data pipeline
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = [str(directory / package.replace(".", "/"))]
            sys.modules[package] = module
    try:
        import core.distributed
        import core.loss  # noqa: F401  (registers their losses)
        from core.configs import descriptor_default_config, matching_default_config
        from core.data.augmentation.mask_mapper import MaskMapper
        from core.loss.build import __loss_factory__
        from core.models.build import build_copy_descriptor, build_paired_copy_detector
        from core.utils.serialization import Checkpointer
    except ImportError as error:
        raise CopyNCEError(f"cannot import the authors' code from {directory}: {error}; install what it needs "
                           "with pip install -e '.[authors]'") from error
    from omegaconf import OmegaConf

    torchvision_transforms = sys.modules["torchvision.transforms"]
    finetune = OmegaConf.load(directory / "core" / "configs" / "train" / "matching" / "finetune.yaml")
    return types.SimpleNamespace(
        descriptor_config=copy.deepcopy(descriptor_default_config), matcher_config=copy.deepcopy(matching_default_config),
        finetuned_matcher_config=OmegaConf.merge(matching_default_config, finetune),
        build_descriptor=build_copy_descriptor, build_matcher=build_paired_copy_detector, losses=__loss_factory__,
        Checkpointer=Checkpointer, MaskMapper=MaskMapper, transforms=torchvision_transforms,
        distributed=core.distributed)


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Move every floating tensor of the model by seeded noise (batch-norm variances stay positive)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if not tensor.is_floating_point():
                continue
            if name.endswith("running_var"):
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=generator))
            else:
                tensor.add_(0.05 * torch.randn(tensor.shape, generator=generator))


def _build(code, kind: str, seed: int):
    """Their model (from their default config; ``finetuned_matcher``: their matching default config merged with
    ``train/matching/finetune.yaml``, which has no fusion head), its losses (by type) and the config."""
    config = {"descriptor": code.descriptor_config, "matcher": code.matcher_config,
              "finetuned_matcher": code.finetuned_matcher_config}[kind]
    torch.manual_seed(seed)
    model = (code.build_descriptor if kind == "descriptor" else code.build_matcher)(config)
    losses = {}
    for group in ("classification_loss", "auxiliary_loss"):
        for item in config.loss.get(group) or []:
            losses[item.type] = code.losses[item.type](item, model)  # InfoNCE registers its log-scale
    _randomise(model, seed + 1)
    return model, losses, config


def checkpoint_layout(state_dict: dict[str, torch.Tensor]) -> dict[str, list[int]]:
    """``{tensor name: shape}`` of a checkpoint's state dict, sorted by name."""
    return {name: list(tensor.shape) for name, tensor in sorted(state_dict.items())}


def _evaluation_transform(code, config):
    """Their evaluation transform, as their evaluation datasets build it from the config."""
    transforms = code.transforms
    size = config.input.img_size
    normalize = config.input.augmentation.post_process.normalize
    return transforms.Compose([
        transforms.Resize((size, size), transforms.InterpolationMode[config.input.augmentation.interpolation.upper()]),
        transforms.ToTensor(),
        transforms.Normalize(normalize.mean, normalize.std),
    ])


# ------------------------------------------------------------------------------------ the batch
def _pixel_maps(batch: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query -> original and reference -> original pixel maps (B, 2, H, W) of a training batch, -1 where a
    pixel has no source: a zoomed crop, an identity, a shift leaving a third of the query untraced,
    and a pair without overlap (cycled over the batch). References are horizontal flips."""
    ys, xs = torch.meshgrid(torch.arange(size, dtype=torch.float32), torch.arange(size, dtype=torch.float32),
                            indexing="ij")
    queries = []
    for index in range(batch):
        case = index % 4
        if case == 0:
            mapping = torch.stack([torch.round(30 + 0.6 * ys), torch.round(50 + 0.6 * xs)])
        elif case == 1:
            mapping = torch.stack([ys, xs])
        elif case == 2:
            mapping = torch.stack([ys + size // 3, xs + 7])
        else:
            mapping = torch.full((2, size, size), -1.0)
        outside = (mapping < 0).any(0) | (mapping >= size).any(0)
        queries.append(torch.where(outside, torch.tensor(-1.0), mapping))
    reference = torch.stack([ys, size - 1 - xs])
    return torch.stack(queries), reference.expand(batch, -1, -1, -1).clone()


@contextlib.contextmanager
def _cuda_is_identity():
    """Their MaskMapper calls ``.cuda()``; the checks run on the CPU (GPU or not), where it leaves tensors."""
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


def _priors(code, query_to_original, reference_to_original, patch_size: int):
    """Our overlap priors (B, L, L) in both directions from the pixel maps their loss derives."""
    mapper = code.MaskMapper
    with _cuda_is_identity():
        original_to_reference = mapper.generate_batch_inverse_mappings(reference_to_original)
        query_to_reference = mapper.generate_batch_transferred_mapping(query_to_original, original_to_reference)
        reference_to_query = mapper.generate_batch_inverse_mappings(query_to_reference)
    size = tuple(query_to_original.shape[-2:])
    priors = []
    for maps in (query_to_reference, reference_to_query):
        tables = []
        for mapping in maps.float():
            coords = mapping.permute(1, 2, 0).numpy().copy()
            coords[(coords < 0).any(-1)] = np.nan
            tables.append(patch_overlap(CoordinateTable(coords, size), patch_size, size))
        priors.append(torch.from_numpy(np.stack(tables)))
    return priors


@contextlib.contextmanager
def _one_process_group(code, folder: Path):
    """A one-process gloo group (their InfoNCE and KoLeo all-gather); ours see one process and gather nothing.

    Their ``core.distributed.enable`` starts NCCL on GPUs; here the group is gloo and their module's
    local rank and size are set as ``enable`` sets them for one process.
    """
    import torch.distributed as dist

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"file://{folder / 'process-group'}", rank=0, world_size=1)
    code.distributed._LOCAL_RANK, code.distributed._LOCAL_WORLD_SIZE = 0, 1
    try:
        yield
    finally:
        code.distributed._LOCAL_RANK, code.distributed._LOCAL_WORLD_SIZE = -1, -1
        if started:
            dist.destroy_process_group()


# ---------------------------------------------------------------------------------- comparisons
def _descriptor_rows(code, model, losses, config, ours: CopyNCEDescriptorModel, pixels, our_pixels, batch):
    layer = next(item.layer for item in config.loss.auxiliary_loss if item.type == "copynce")
    rows = []
    model.eval()
    ours.eval()
    with torch.no_grad():
        theirs = model({"images": pixels})
        mine = ours(pixels)
        mine_own = ours(our_pixels)
    rows += [
        _output_row("descriptor: descriptors (their pixels)", mine.descriptors, theirs["feat"]),
        _output_row("descriptor: CopyNCE token map (block output, patches)", mine.patch_tokens,
                    theirs["encoder_output"]["block_outputs"][layer][:, 1:]),
        _output_row("descriptor: descriptors (each side's preprocessing)", mine_own.descriptors, theirs["feat"]),
    ]
    # One training step's forward on copy pairs: batch norm on batch statistics, the losses.
    model.train()
    ours.train()
    queries, references, query_maps, reference_maps, overlap_qr, overlap_rq = batch
    size = queries.shape[0]
    inputs = {"queries": queries, "references": references, "cls_gt": torch.ones(size, dtype=torch.long),
              "que_to_ori_mappings": query_maps, "ref_to_ori_mappings": reference_maps,
              "copynce": torch.ones(size, dtype=torch.bool)}
    with torch.no_grad():
        outputs = model(inputs)
        with _cuda_is_identity():
            their_losses = {name: loss.calculate(outputs, inputs) for name, loss in losses.items()}
        mine = ours(queries, reference_pixel_values=references, overlap_qr=overlap_qr, overlap_rq=overlap_rq,
                    pair_mask=torch.ones(size, dtype=torch.bool))
    rows += [
        _output_row("descriptor, training: query descriptors (batch statistics)", mine.descriptors,
                    outputs["que_feat"]),
        _output_row("descriptor, training: reference descriptors (batch statistics)", mine.reference_descriptors,
                    outputs["ref_feat"]),
        _loss_row("descriptor loss: InfoNCE", mine.infonce_loss, their_losses["infonce"]),
        _loss_row("descriptor loss: KoLeo", mine.koleo_loss, their_losses["keleo_loss"]),
        _loss_row("descriptor loss: CopyNCE", mine.copynce_loss, their_losses["copynce"]),
    ]
    return rows


def _matcher_rows(model, losses, ours: CopyNCEMatcherModel, pixels, batch):
    rows = []
    references = pixels.roll(1, dims=0)
    model.eval()
    ours.eval()
    with torch.no_grad():
        probabilities = model({"queries": pixels, "references": references})["preds"].squeeze(-1)
        mine = ours(pixels, references)
        model.train()  # their classification head returns the logit in training mode (no dropout is configured)
        theirs = model({"queries": pixels, "references": references})
    rows += [
        _output_row("matcher: copy logits", mine.logits, theirs["preds"].squeeze(-1)),
        _output_row("matcher: copy probabilities", torch.sigmoid(mine.logits), probabilities),
        _output_row("matcher: CopyNCE token map, query", mine.query_patch_tokens,
                    theirs["fusion_head_que_patch_tokens"]),
        _output_row("matcher: CopyNCE token map, reference", mine.reference_patch_tokens,
                    theirs["fusion_head_ref_patch_tokens"]),
    ]
    queries, references, query_maps, reference_maps, overlap_qr, overlap_rq = batch
    size = queries.shape[0]
    labels = (torch.arange(size) % 4 != 3).long()  # the pairs without overlap are negatives
    inputs = {"queries": queries, "references": references, "cls_gt": labels,
              "que_to_ori_mappings": query_maps, "ref_to_ori_mappings": reference_maps,
              "copynce": torch.ones(size, dtype=torch.bool)}
    ours.train()
    with torch.no_grad():
        outputs = model(inputs)
        with _cuda_is_identity():
            their_losses = {name: loss.calculate(outputs, inputs) for name, loss in losses.items()}
        mine = ours(queries, references, labels=labels, overlap_qr=overlap_qr, overlap_rq=overlap_rq,
                    pair_mask=torch.ones(size, dtype=torch.bool))
    rows += [
        _loss_row("matcher loss: BCE", mine.bce_loss, their_losses["bce_loss"]),
        _loss_row("matcher loss: CopyNCE", mine.copynce_loss, their_losses["copynce"]),
    ]
    return rows


def _finetuned_matcher_rows(code, folder: Path, pixels: torch.Tensor, seed: int) -> list[Row]:
    """Their finetuned matcher (``fusion_head: null``) saved, converted and compared: copy logits and probabilities."""
    model, _, _ = _build(code, "finetuned_matcher", seed)
    code.Checkpointer(0, str(folder / "authors-finetuned-matcher"), model=model).step(1)
    converted = convert_authors_checkpoint(folder / "authors-finetuned-matcher" / "checkpoint.pth.tar", "matcher",
                                           folder / "converted-finetuned-matcher")
    ours = CopyNCEMatcherModel.from_pretrained(converted, dtype=torch.float32, attn_implementation="eager").eval()
    references = pixels.roll(1, dims=0)
    model.eval()
    with torch.no_grad():
        probabilities = model({"queries": pixels, "references": references})["preds"].squeeze(-1)
        logits = ours(pixels, references).logits
    return [_output_row("finetuned matcher (their finetune.yaml, no fusion head): copy probabilities",
                        torch.sigmoid(logits), probabilities)]


def _converted_models(code, folder: Path, seed: int, layout: dict) -> dict:
    """kind -> ``(their model, their losses, their config, our model converted from their checkpoint)`` for the
    descriptor and the matcher, seeded; the layout of each checkpoint goes to ``layout``."""
    models = {}
    for offset, kind in enumerate(("descriptor", "matcher")):
        model, losses, config = _build(code, kind, seed + 10 * offset)
        code.Checkpointer(0, str(folder / f"authors-{kind}"), model=model).step(1)
        layout[kind] = checkpoint_layout(model.state_dict())
        converted = convert_authors_checkpoint(folder / f"authors-{kind}" / "checkpoint.pth.tar", kind,
                                               folder / f"converted-{kind}")
        model_class = CopyNCEDescriptorModel if kind == "descriptor" else CopyNCEMatcherModel
        # The eager attention writes out the softmax as their Attention does (SDPA, the default backend,
        # fuses it: its float rounding on their raw, unnormalised tokens is of the order of the limit).
        ours = model_class.from_pretrained(converted, dtype=torch.float32, attn_implementation="eager")
        models[kind] = (model, losses, config, ours)
    return models


def run_checks(authors_code: str | Path, images: list[Path], seed: int = 0, batch_size: int = 6,
               work_folder: str | Path | None = None) -> tuple[list[Row], dict]:
    """Compare this package with the authors' code (see the module docstring).

    Args:
        authors_code: a checkout of GitHub eddielyc/CopyNCE.
        images: image files for the outputs and the training batch (at least 2).
        seed: seeds the random weights and noise.
        batch_size: pairs of the training batch (>= 4 covers every kind of pair; at most the number of
            images, since a repeated image gives two equal descriptors, where the KoLeo forms differ).
        work_folder: where the checkpoints and converted folders go (a temporary folder by default).

    Returns:
        ``(rows, layout)``: the comparisons and ``{"descriptor": {name: shape}, "matcher": ...}`` of
        their checkpoints.
    """
    if len(images) < 2:
        raise CopyNCEError("the checks need at least 2 images")
    batch_size = min(batch_size, len(images))
    code = _import_authors_code(Path(authors_code))
    rows, layout = [], {}
    with contextlib.ExitStack() as stack:
        folder = Path(work_folder) if work_folder else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        stack.enter_context(_one_process_group(code, folder))
        stack.enter_context(torch.random.fork_rng())
        models = _converted_models(code, folder, seed, layout)

        config = code.descriptor_config
        transform = _evaluation_transform(code, config)
        opened = [Image.open(path) for path in images]
        pixels = torch.stack([transform(image.convert("RGB")) for image in opened])
        processor = CopyNCEImageProcessor.from_pretrained(folder / "converted-descriptor")
        our_pixels = processor(opened, return_tensors="pt")["pixel_values"]
        rows.append(_output_row("preprocessing: pixel values (their evaluation transform vs the image processor)",
                                our_pixels, pixels))

        chosen = [pixels[index % len(pixels)] for index in range(batch_size)]
        queries = torch.stack(chosen)
        # References: horizontal flips (their maps to the original say so) blended with another image of
        # the batch, so that no pair is trivially told apart (InfoNCE would then be exactly 0).
        references = 0.6 * torch.flip(queries, dims=[-1]) + 0.4 * queries.roll(1, dims=0)
        query_maps, reference_maps = _pixel_maps(batch_size, config.input.img_size)
        overlap_qr, overlap_rq = _priors(code, query_maps, reference_maps, config.model.patch_size)
        if not math.isclose(float(overlap_qr[1].sum()), overlap_qr.shape[1], rel_tol=1e-6):
            raise CopyNCEError("the identity pair's prior is not complete: the pixel maps were not read as meant")
        batch = (queries, references, query_maps, reference_maps, overlap_qr, overlap_rq)
        rows += _descriptor_rows(code, models["descriptor"][0], models["descriptor"][1], config,
                                 models["descriptor"][3], pixels, our_pixels, batch)
        rows += _matcher_rows(models["matcher"][0], models["matcher"][1], models["matcher"][3], pixels, batch)
        rows += _finetuned_matcher_rows(code, folder, pixels, seed + 20)
    return rows, layout
