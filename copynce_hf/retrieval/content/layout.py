"""Layout crops: where a photo sits inside its frame, read from the one image alone (beyond the paper).

Content tokens and content crops (:mod:`.tokens`, :mod:`.crops`) recognise a frame that several images of a run
share. A frame met once (one screenshot of a post, a poster, a print lying on a desk, a photo pasted onto another)
is recognised here from the image's own pixels, by three cues of how such images are made:

1. **A rectangle of straight sides** (:func:`rectangle_boxes`): a photo pasted into a frame keeps its four straight
   sides, each a jump of colour along a whole row or column segment, where the photo's own edges are broken and rows
   of text jump as much a few pixels away. Candidate lines are the rows and columns most like such a side; a
   rectangle of four of them scores its weakest side (the share of it covered by jumps; the image's own border is a
   side of middling strength) squared, times the share of its inside that is not flat squared, times the square root of its area.
2. **A region not of the frame's colours** (:func:`blob_boxes`): a user interface, a poster or a border is drawn in a
   few flat colours, those of the image's outer ring, with text and icons in small pieces; what is left in one large
   piece, not mostly of one colour, is content.
3. **A dense region** (:func:`dense_boxes`): a photo is textured almost everywhere, a frame's flat colours, rules and
   rows of text are not: the pixels whose 9 x 9 neighbourhood is at least 85 % textured form regions.

Rectangles and dense regions are read at :data:`ANALYSIS_SIDE` pixels on the image's longer side, the regions of
cue 2 at :data:`BLOB_SIDE` (a few tens of milliseconds in all). A box covers between :data:`MIN_SHARE` and
:data:`MAX_SHARE` of the image; :func:`layout_boxes` gives the best box of each cue (:data:`LAYOUT_CROPS` at most),
none nearly equal to an earlier one. A plain photo gets boxes too (its own straight edges, its textured parts): no
box is trusted by itself. ``detect``'s query crops (:mod:`~copynce_hf.retrieval.content.queries`) describe each one,
and a box changes a score only where its descriptor is nearer a reference than the whole query's and the matcher
verifies the pair on it. The cues and values were chosen on development draws of the lone framed query benchmark
(``train`` photos only: benchmarks/LOG.md, "Lone framed queries").

Boxes are ``(left, top, right, bottom)`` fractions of the image's width and height (:data:`~.crops.Box`).
"""

from __future__ import annotations

import cv2
import numpy as np
from PIL import Image

__all__ = ["ANALYSIS_SIDE", "BLOB_SIDE", "LAYOUT_CROPS", "MIN_SHARE", "MAX_SHARE", "analysis_pixels",
           "rectangle_boxes", "blob_boxes", "dense_boxes", "layout_boxes", "box_iou"]

#: The longer side, in pixels, at which an image's layout is read.
ANALYSIS_SIDE = 256
#: Boxes proposed per image at most: a region not of the frame's colours, a rectangle, a dense region.
LAYOUT_CROPS = 3
#: Rectangles and dense regions proposed per image (cues 1 and 3), before repeated boxes are dropped.
RECTANGLES, DENSE_REGIONS = 1, 1
#: A box covers at least this share of the image, and less than :data:`MAX_SHARE` (a larger one is the image).
MIN_SHARE = 0.03
MAX_SHARE = 0.6
#: A box's width and height are at least this share of the image's.
MIN_SIDE = 0.1
#: A jump of this many levels (0-255, the largest over the channels) between the pixels on either side of a line is
#: an edge pixel of that line.
EDGE_JUMP = 24.0
#: Candidate lines per direction, and the share of the image's width (height) a row's (column's) edge pixels cover at
#: least.
LINES, MIN_LINE = 16, 0.08
#: A rectangle's weakest side is covered by edges along at least this share of its length; a side on the image's own
#: border counts as covered this much (a band between two lines across the whole image is no better than a photo's
#: four sides).
MIN_STRENGTH, BORDER_SIDE = 0.5, 0.6
#: A pixel is flat when no neighbour two pixels away differs by more than this many levels.
FLAT_JUMP = 3.0
#: A dense region: pixels whose (2 r + 1)-square neighbourhood is at least this share textured.
DENSE_RADIUS, DENSE_SHARE = 4, 0.85
#: The frame's colours: each fills at least this share of the image's outer ring; a pixel within this many levels of
#: one (every channel) is the frame's.
FRAME_COLOUR_SHARE, FRAME_TOLERANCE = 0.05, 12.0
#: Cue 2: the longer side, in pixels, at which regions are read (text stays rows of letters), the regions proposed,
#: and the share of a region's pixels in one colour cube (16 levels a side) at which it is a flat part of the frame
#: (a button, a banner).
BLOB_SIDE = 384
BLOBS, ONE_COLOUR = 1, 0.7
#: Two boxes overlapping by at least this intersection over union are one.
SAME_BOX = 0.6

Box = tuple[float, float, float, float]


def analysis_pixels(image: Image.Image, side: int = ANALYSIS_SIDE) -> np.ndarray:
    """(H, W, 3) float32 pixels (0-255) of ``image`` shrunk (area averaging) to ``side`` on its longer side."""
    image = image.convert("RGB")
    scale = side / max(image.size)
    size = (max(16, round(image.width * scale)), max(16, round(image.height * scale)))
    return cv2.resize(np.asarray(image), size, interpolation=cv2.INTER_AREA).astype(np.float32)


def _largest_channel_difference(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """(..., 3) and (..., 3) (or (3,)) -> (...): ``|first - second|`` of the channel where it is largest (as
    ``np.abs(first - second).max(-1)``, channel by channel: a reduction over three values is slow in numpy)."""
    largest = np.abs(first[..., 0] - second[..., 0])
    for channel in (1, 2):
        np.maximum(largest, np.abs(first[..., channel] - second[..., channel]), out=largest)
    return largest


def _jumps(pixels: np.ndarray) -> np.ndarray:
    """(H, W, 3) -> (H, W): the jump across a horizontal line at each pixel, ``|p[y + 1] - p[y - 1]|`` (largest
    channel; 0 on the first and last rows)."""
    jumps = np.zeros(pixels.shape[:2], np.float32)
    jumps[1:-1] = _largest_channel_difference(pixels[2:], pixels[:-2])
    return jumps


def _line_evidence(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For horizontal lines at every row: ``(edges, jumps, context)``, each (H, W) float32: an edge pixel (a jump of
    :data:`EDGE_JUMP` within one row of it), the largest jump within one row, and the jump three rows above or below
    (what the image's own texture gives: a pasted photo's side jumps more than its surroundings)."""
    jumps = _jumps(pixels)
    near = jumps.copy()
    near[1:] = np.maximum(near[1:], jumps[:-1])
    near[:-1] = np.maximum(near[:-1], jumps[1:])
    context = np.zeros_like(jumps)
    context[3:] = jumps[:-3]
    context[:-3] = np.maximum(context[:-3], jumps[3:])
    return (near > EDGE_JUMP).astype(np.float32), near, context


def _lines(evidence: tuple[np.ndarray, ...]) -> np.ndarray:
    """The sorted rows of the :data:`LINES` horizontal lines most like a side (rows three apart at least, each with
    edge pixels along :data:`MIN_LINE` of the width or more), and the first and last rows. A row's strength is the
    share of it covered by edge pixels, lowered where its jumps are not twice its context's (rows of text jump as
    much three rows away; a pasted photo's side does not). ``evidence``: :func:`_line_evidence`'s."""
    edges, jumps, context = evidence
    coverage = edges.sum(1) / edges.shape[1]
    strength = coverage * np.minimum(1.0, (jumps.sum(1) + 1) / (context.sum(1) + 1) / 2)
    chosen: list[int] = []
    for row in np.argsort(-strength, kind="stable"):
        if len(chosen) == LINES:
            break
        if coverage[row] >= MIN_LINE and all(abs(int(row) - other) > 2 for other in chosen):
            chosen.append(int(row))
    return np.array(sorted({0, edges.shape[0] - 1, *chosen}))


def _side_strengths(evidence: tuple[np.ndarray, ...], lines: np.ndarray, across: np.ndarray) -> np.ndarray:
    """How well each segment of each horizontal line is a side: (n, m, m) float, ``[i, a, b]`` the segment of row
    ``lines[i]`` from column ``across[a]`` to ``across[b]``: the share of it covered by edge pixels, lowered where its
    jumps are not twice its context's (:data:`BORDER_SIDE` on the image's first and last rows). ``evidence``:
    :func:`_line_evidence`'s."""
    edges, jumps, context = (values[lines].astype(np.float64) for values in evidence)

    def segments(values: np.ndarray) -> np.ndarray:
        prefix = np.concatenate([np.zeros((len(values), 1)), np.cumsum(values, 1)], 1)[:, across]  # (n, m)
        return prefix[:, None, :] - prefix[:, :, None]

    length = np.maximum(1, across[None, :] - across[:, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        coverage = segments(edges) / length
        contrast = (segments(jumps) + 1) / (segments(context) + 1)
    strength = np.minimum(coverage, np.minimum(contrast / 2, 1.0))
    strength[(lines == 0) | (lines == evidence[0].shape[0] - 1)] = BORDER_SIDE
    return np.nan_to_num(strength)


def _flat(pixels: np.ndarray) -> np.ndarray:
    """(H, W, 3) -> (H, W) bool: no neighbour two pixels away (across or along) differs by more than
    :data:`FLAT_JUMP`; the outermost pixels count as flat."""
    rough = np.zeros(pixels.shape[:2], np.float32)
    rough[1:-1, 1:-1] = np.maximum(_largest_channel_difference(pixels[2:, 1:-1], pixels[:-2, 1:-1]),
                                   _largest_channel_difference(pixels[1:-1, 2:], pixels[1:-1, :-2]))
    return rough <= FLAT_JUMP


def rectangle_boxes(pixels: np.ndarray, count: int = RECTANGLES, flat: np.ndarray | None = None
                    ) -> list[tuple[float, Box]]:
    """The best ``count`` rectangles of straight sides in (H, W, 3) pixels (module docstring, cue 1), as ``(score,
    box)``, best first, none overlapping a better one by :data:`SAME_BOX`; ``flat``: the pixels' (H, W) flat mask
    where already computed (:func:`_flat`)."""
    height, width = pixels.shape[:2]
    horizontal, vertical = _line_evidence(pixels), _line_evidence(pixels.transpose(1, 0, 2))
    rows, columns = _lines(horizontal), _lines(vertical)
    across = _side_strengths(horizontal, rows, columns)  # (rows, columns, columns): top and bottom sides
    down = _side_strengths(vertical, columns, rows)  # (columns, rows, rows): left and right sides
    sides = np.minimum(np.minimum(across[:, None, :, :], across[None, :, :, :]),  # (top, bottom, left, right)
                       np.minimum(down.transpose(1, 2, 0)[:, :, :, None], down.transpose(1, 2, 0)[:, :, None, :]))
    flat_sums = np.zeros((height + 1, width + 1))
    flat_sums[1:, 1:] = (_flat(pixels) if flat is None else flat).cumsum(0).cumsum(1)
    corners = flat_sums[rows][:, columns]  # (rows, columns)
    flat_sum = (corners[None, :, None, :] - corners[:, None, None, :] - corners[None, :, :, None]
                + corners[:, None, :, None])
    tall = (rows[None, :] - rows[:, None]).astype(np.float64)[:, :, None, None]
    wide = (columns[None, :] - columns[:, None]).astype(np.float64)[None, None]
    share = tall * wide / (height * width)
    valid = ((tall >= MIN_SIDE * height) & (wide >= MIN_SIDE * width) & (share >= MIN_SHARE) & (share < MAX_SHARE)
             & (sides >= MIN_STRENGTH))
    share, area = np.broadcast_to(share, valid.shape)[valid], np.broadcast_to(tall * wide, valid.shape)[valid]
    score = np.zeros(valid.shape)
    score[valid] = sides[valid] ** 2 * np.sqrt(share) * (1 - flat_sum[valid] / area) ** 2
    found: list[tuple[float, Box]] = []
    for flat_index in np.argsort(-score, axis=None)[: 64 * count]:
        top, bottom, left, right = np.unravel_index(flat_index, score.shape)
        value = float(score[top, bottom, left, right])
        if value <= 0 or len(found) == count:
            break
        box = (float(columns[left] / width), float(rows[top] / height), float(columns[right] / width),
               float(rows[bottom] / height))
        if all(box_iou(box, other) < SAME_BOX for _, other in found):
            found.append((value, box))
    return found


def dense_boxes(pixels: np.ndarray, count: int = DENSE_REGIONS, flat: np.ndarray | None = None) -> list[Box]:
    """The boxes of the ``count`` largest dense regions of (H, W, 3) pixels (module docstring, cue 3) that fit the
    size limits, largest first; ``flat`` as in :func:`rectangle_boxes`."""
    height, width = pixels.shape[:2]
    textured = (~(_flat(pixels) if flat is None else flat)).astype(np.float32)
    side = 2 * DENSE_RADIUS + 1
    dense = cv2.boxFilter(textured, -1, (side, side), borderType=cv2.BORDER_REPLICATE) >= DENSE_SHARE
    found, _, stats, _ = cv2.connectedComponentsWithStats(dense.astype(np.uint8), connectivity=8)
    boxes: list[Box] = []
    for label in np.argsort(-stats[1:, cv2.CC_STAT_AREA], kind="stable") + 1:
        left, top, wide, tall = (int(stats[label, key]) for key in (cv2.CC_STAT_LEFT, cv2.CC_STAT_TOP,
                                                                     cv2.CC_STAT_WIDTH, cv2.CC_STAT_HEIGHT))
        share = wide * tall / (height * width)
        if MIN_SHARE <= share < MAX_SHARE and wide >= MIN_SIDE * width and tall >= MIN_SIDE * height:
            boxes.append((left / width, top / height, (left + wide) / width, (top + tall) / height))
        if len(boxes) == count:
            break
    return boxes


def _frame_colours(pixels: np.ndarray) -> np.ndarray:
    """(K, 3) the colours that fill the image's outer ring (two pixels wide) at least :data:`FRAME_COLOUR_SHARE` each
    (colours grouped in cubes of 16 levels; each the mean of its cube's ring pixels), most common first; (0, 3) for an
    image whose border is a photo or a texture."""
    ring = np.concatenate([pixels[:2].reshape(-1, 3), pixels[-2:].reshape(-1, 3), pixels[2:-2, :2].reshape(-1, 3),
                           pixels[2:-2, -2:].reshape(-1, 3)])
    cubes = (ring // 16).astype(np.int64) @ np.array([256, 16, 1])
    values, counts = np.unique(cubes, return_counts=True)
    colours = [ring[cubes == value].mean(0) for value, count in sorted(zip(values, counts), key=lambda item: -item[1])
               if count >= FRAME_COLOUR_SHARE * len(ring)]
    return np.array(colours, np.float32).reshape(-1, 3)


def blob_boxes(image: Image.Image, count: int = BLOBS) -> list[Box]:
    """The boxes of the ``count`` largest regions of ``image`` that are not its frame's colours (module docstring, cue
    2): read at :data:`BLOB_SIDE` pixels, the frame's colours those of its outer ring; a region that is mostly one
    colour (a button, a banner) or outside the size limits is left out. Largest first; none when the ring is no
    frame (a photo, a texture)."""
    pixels = analysis_pixels(image, BLOB_SIDE)
    height, width = pixels.shape[:2]
    colours = _frame_colours(pixels)
    if not len(colours):
        return []
    frame = np.zeros(pixels.shape[:2], bool)
    for colour in colours:
        frame |= _largest_channel_difference(pixels, colour) <= FRAME_TOLERANCE
    found, labels, stats, _ = cv2.connectedComponentsWithStats((~frame).astype(np.uint8), connectivity=8)
    cubes = (pixels // 16).astype(np.int64) @ np.array([256, 16, 1])
    boxes: list[Box] = []
    for label in np.argsort(-stats[1:, cv2.CC_STAT_AREA], kind="stable")[: 4 * count] + 1:
        left, top, wide, tall = (int(stats[label, key]) for key in (cv2.CC_STAT_LEFT, cv2.CC_STAT_TOP,
                                                                     cv2.CC_STAT_WIDTH, cv2.CC_STAT_HEIGHT))
        share = wide * tall / (height * width)
        if not (MIN_SHARE <= share < MAX_SHARE and wide >= MIN_SIDE * width and tall >= MIN_SIDE * height):
            continue
        members = cubes[top:top + tall, left:left + wide][labels[top:top + tall, left:left + wide] == label]
        if np.unique(members, return_counts=True)[1].max() < ONE_COLOUR * len(members):
            boxes.append((left / width, top / height, (left + wide) / width, (top + tall) / height))
        if len(boxes) == count:
            break
    return boxes


def layout_boxes(image: Image.Image, count: int = LAYOUT_CROPS) -> list[Box]:
    """Where ``image``'s own content may sit inside a frame: at most ``count`` boxes, the best of each cue (the region
    not of the frame's colours first: it is found only where the frame is drawn in flat colours, and then exactly;
    then the rectangle of straight sides, then the dense region), none overlapping an earlier one by
    :data:`SAME_BOX`; none for an image whose layout shows no frame."""
    pixels = analysis_pixels(image)
    flat = _flat(pixels)
    found = blob_boxes(image, BLOBS) + [box for _, box in rectangle_boxes(pixels, RECTANGLES, flat)]
    found += dense_boxes(pixels, DENSE_REGIONS, flat)
    boxes: list[Box] = []
    for box in found:
        if len(boxes) < count and all(box_iou(box, other) < SAME_BOX for other in boxes):
            boxes.append(box)
    return boxes


def box_iou(first: Box, second: Box) -> float:
    """Intersection over union of two boxes."""
    left, top = max(first[0], second[0]), max(first[1], second[1])
    right, bottom = min(first[2], second[2]), min(first[3], second[3])
    inter = max(0.0, right - left) * max(0.0, bottom - top)
    union = ((first[2] - first[0]) * (first[3] - first[1]) + (second[2] - second[0]) * (second[3] - second[1])
             - inter)
    return inter / union if union > 0 else 0.0
