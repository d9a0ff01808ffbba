"""CopyNCE options (averaging over pairs, reverse prior) pinned against brute-force loops, every combination."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_editor import textured_image

from copynce_hf.data import PixTraceCollator
from copynce_hf.data.collator import CopyPair
from copynce_hf.modeling.errors import CopyNCEError
from copynce_hf.modeling.losses_copynce import copynce_loss
from copynce_hf.pixtrace import replay
from copynce_hf.pixtrace.edits import PasteIntoBox, Resize

SOURCE = (40, 48)  # (H, W) of the original
SIZE = 32  # model input
PATCH = 8
GRID = SIZE // PATCH
BOX = dict(left=5, top=3, box_height=14, box_width=18)  # the query shows the original shrunk into this box


def _pairs():
    original = textured_image(*SOURCE)
    spec = {"kind": "noise", "seed": 3, "size": [SIZE, SIZE]}
    query = replay(original, [PasteIntoBox(spec, SIZE, SIZE, **BOX).to_dict()])
    reference = replay(original, [Resize(SIZE, SIZE).to_dict()])
    light = replay(original, [Resize(SIZE, SIZE).to_dict()])
    return [
        CopyPair(query.image, reference.image, query.table, reference.table, 1),  # shrunk copy: scatter holes
        CopyPair(light.image, reference.image, None, None, 0),  # a negative pair
        CopyPair(light.image, reference.image, light.table, reference.table, 1),  # an unedited copy
    ]


# ---------------------------------------------------------------------- brute-force priors


def _to_source(value, size_from, size_to):
    """Area-aligned resize: position in an image of side ``size_from`` -> side ``size_to``."""
    return (value + 0.5) * size_to / size_from - 0.5


def _patch(y, x):
    return (int(math.floor((y + 0.5) / PATCH)), int(math.floor((x + 0.5) / PATCH)))


def _brute_priors(kind: int, reverse: str) -> tuple[np.ndarray, np.ndarray]:
    """(qr, rq) priors from the closed-form geometry of pair ``kind`` (0: pasted box, 2: resize), pixel by pixel."""
    length = GRID * GRID
    qr, rq = np.zeros((length, length)), np.zeros((length, length))
    top, left, box_h, box_w = BOX["top"], BOX["left"], BOX["box_height"], BOX["box_width"]

    def query_to_reference(qy, qx):  # None where the query pixel is not the copy
        if kind == 2:
            return float(qy), float(qx)
        if not (top <= qy < top + box_h and left <= qx < left + box_w):
            return None
        sy, sx = _to_source(qy - top, box_h, SOURCE[0]), _to_source(qx - left, box_w, SOURCE[1])
        return _to_source(sy, SOURCE[0], SIZE), _to_source(sx, SOURCE[1], SIZE)

    holder = {}
    for qy in range(SIZE):
        for qx in range(SIZE):
            position = query_to_reference(qy, qx)
            if position is None:
                continue
            ry, rx = position
            py, px = _patch(ry, rx)
            if 0 <= py < GRID and 0 <= px < GRID:
                qr[(qy // PATCH) * GRID + qx // PATCH, py * GRID + px] += 1
            holder[(int(np.rint(ry)), int(np.rint(rx)))] = (qy, qx)  # last writer wins (row-major)
    for ry in range(SIZE):
        for rx in range(SIZE):
            if reverse == "scatter":
                if (ry, rx) not in holder:
                    continue
                qy, qx = holder[(ry, rx)]
                rq[(ry // PATCH) * GRID + rx // PATCH, (qy // PATCH) * GRID + qx // PATCH] += 1
                continue
            if kind == 2:
                qy, qx = float(ry), float(rx)
            else:  # exact inverse: reference -> source -> the box of the query
                sy, sx = _to_source(ry, SIZE, SOURCE[0]), _to_source(rx, SIZE, SOURCE[1])
                qy, qx = _to_source(sy, SOURCE[0], box_h) + top, _to_source(sx, SOURCE[1], box_w) + left
                if not (top - 0.5 <= qy < top + box_h - 0.5 and left - 0.5 <= qx < left + box_w - 0.5):
                    continue
            py, px = _patch(qy, qx)
            rq[(ry // PATCH) * GRID + rx // PATCH, py * GRID + px] += 1
    return qr / PATCH**2, rq / PATCH**2


# ---------------------------------------------------------------------- brute-force loss


def _brute_direction(logits: np.ndarray, prior: np.ndarray, gamma: float, weighting: str) -> tuple[float, bool]:
    losses, rows = [], 0
    for i in range(prior.shape[0]):
        row = prior[i].astype(np.float64)
        log_p = logits[i] - np.log(np.exp(logits[i]).sum())
        if weighting == "authors_code":
            nowhere = 1.0 - row.sum()
            full = np.append(row, nowhere if nowhere > 1e-5 else 0.0)
            weights = np.where(full > 0, full**gamma, 0.0)
            weights = weights / weights.sum() if weights.sum() > 0 else weights
            losses.append(-(weights[:-1] * log_p).sum())
        elif row.sum() > 0:
            weights = row**gamma / (row**gamma).sum()
            losses.append(-(weights * log_p).sum())
        rows += row.sum() > 0
    return (float(np.mean(losses)) if losses else 0.0), rows > 0


def _brute_loss(q_tokens, r_tokens, priors, labels, gamma, weighting, average, temperature=1 / 16):
    total, count = 0.0, 0
    for b, (qr, rq) in enumerate(priors):
        q = q_tokens[b] / np.linalg.norm(q_tokens[b], axis=1, keepdims=True)
        r = r_tokens[b] / np.linalg.norm(r_tokens[b], axis=1, keepdims=True)
        logits = q @ r.T / temperature
        loss_qr, has_qr = _brute_direction(logits, qr, gamma, weighting)
        loss_rq, has_rq = _brute_direction(logits.T, rq, gamma, weighting)
        if labels[b] and has_qr and has_rq:
            total += 0.5 * (loss_qr + loss_rq)
            count += 1
    return total / (len(priors) if average == "all_pairs" else count)


@pytest.mark.parametrize("weighting", ["paper", "authors_code"])
@pytest.mark.parametrize("average", ["overlap_pairs", "all_pairs"])
@pytest.mark.parametrize("reverse", ["exact", "scatter"])
def test_copynce_option_combinations_match_brute_force(reverse, average, weighting):
    pairs = _pairs()
    batch = PixTraceCollator(SIZE, PATCH, reverse_prior=reverse)(pairs)
    zeros = np.zeros((GRID**2, GRID**2))
    priors = [_brute_priors(0, reverse), (zeros, zeros), _brute_priors(2, reverse)]
    for b in (0, 2):
        np.testing.assert_allclose(batch["overlap_qr"][b].numpy(), priors[b][0], atol=1e-6)
        np.testing.assert_allclose(batch["overlap_rq"][b].numpy(), priors[b][1], atol=1e-6)
    generator = torch.Generator().manual_seed(0)
    q_tokens = torch.randn(3, GRID**2, 8, generator=generator, dtype=torch.float64)
    r_tokens = torch.randn(3, GRID**2, 8, generator=generator, dtype=torch.float64)
    loss = copynce_loss(q_tokens, r_tokens, batch["overlap_qr"].double(), batch["overlap_rq"].double(), gamma=3.0,
                        weighting=weighting, pair_mask=batch["pair_mask"] & (batch["labels"] > 0), average=average)
    expected = _brute_loss(q_tokens.numpy(), r_tokens.numpy(), priors, batch["labels"].numpy(), 3.0, weighting,
                           average)
    assert loss.item() == pytest.approx(expected, rel=1e-9)


def test_scatter_inverse_leaves_holes_where_the_query_is_a_shrunk_copy():
    exact = PixTraceCollator(SIZE, PATCH)(_pairs())
    scatter = PixTraceCollator(SIZE, PATCH, reverse_prior="scatter")(_pairs())
    torch.testing.assert_close(exact["overlap_qr"], scatter["overlap_qr"])  # the forward prior is the same
    assert scatter["overlap_rq"][0].sum() < 0.5 * exact["overlap_rq"][0].sum()  # 14x18 query pixels for 32x32
    torch.testing.assert_close(exact["overlap_rq"][2], scatter["overlap_rq"][2])  # a same-size copy has no holes
    with pytest.raises(CopyNCEError, match="average"):
        copynce_loss(torch.zeros(1, 4, 2), torch.zeros(1, 4, 2), torch.zeros(1, 4, 4), torch.zeros(1, 4, 4),
                     average="positive_pairs")
