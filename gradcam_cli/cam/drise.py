"""D-RISE's passes (Petsiuk et al., "Black-box Explanation of Object Detectors via Saliency Maps", CVPR 2021; its map
is :mod:`gradcam_cli.cam.methods.perturbation`'s ``drise``): a detector run on randomly masked copies of the input,
each copy's detections compared with every explained detection at once.

**The masks** are RISE's, drawn as :mod:`gradcam_cli.cam.perturbation` draws them (``--rise-masks`` N, grid, p,
``--seed``): the same masks for every detection of an image, so that one pass per mask (``batch_size`` masked
inputs per forward pass, on the model's device) scores them all, and the cost does not grow with the number of
detections explained.

**Detection vectors** (the paper's d = (L, O, P)): a box L, an objectness O and a vector P of class scores.
A torchvision detector returns only each detection's top score s of its label: P is rebuilt from it, s at the label
and the rest, 1 - s, spread evenly over the other C - 1 classes (C: the model's class count, its category names,
or one more than the highest label seen). A YOLO detection's P is the sigmoid of its anchor's raw class logits
(:mod:`gradcam_cli.cam.yolo`: every class's confidence at the anchor it was traced to). O is the detection's
``objectness`` where the detector's output has that key (one value per detection), else 1: neither torchvision's
detectors nor ultralytics' anchor-free heads (YOLOv8 and later) return one.

**Similarity** (the paper's Eq. 2-3): s(d_t, d_j) = IoU(L_t, L_j) · cos(P_t, P_j) · O_j between an explained
detection d_t (of the unmasked image) and a detection d_j of a masked image; the mask's weight for d_t is the best
match among the masked image's detections, w_i^t = max_j s(d_t, d_j), 0 when it has none. The combined target's
weight is the sum of the image's explained detections' weights (its map the sum of theirs).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torchvision.ops import box_iou

from ..options import PerturbationOptions
from .perturbation import Forward, Progress, check_perturbation, rise_masks


@dataclass(frozen=True)
class DetectionVectors:
    """M detections as D-RISE compares them: ``boxes`` (M, 4) ``(x1, y1, x2, y2)`` in the network input's pixels,
    ``classes`` (M, C) class-score vectors, ``objectness`` (M,) (``None``: the detector has none, 1)."""

    boxes: torch.Tensor
    classes: torch.Tensor
    objectness: torch.Tensor | None = None


@runtime_checkable
class Proposed(Protocol):
    """Targets whose detections D-RISE compares: a detector's (:class:`~gradcam_cli.cam.detection.DetectionTargets`,
    :class:`~gradcam_cli.cam.yolo.YoloTargets`)."""

    @property
    def count(self) -> int: ...

    def explained_vectors(self, n: int) -> DetectionVectors:
        """Image n's explained detections, in target order (target k is row k)."""
        ...

    def proposals(self, output: object) -> list[DetectionVectors]:
        """Every detection of each image of another pass's ``output``."""
        ...


def class_vectors(labels: torch.Tensor, scores: torch.Tensor, classes: int) -> torch.Tensor:
    """(M,) labels and top scores s -> (M, C) vectors: s at the label, (1 - s) / (C - 1) at every other class; C is
    ``classes``, or one more than the highest label where that is more."""
    width = max(classes, int(labels.max()) + 1 if labels.numel() else 0, 2)
    rest = ((1 - scores.float()) / (width - 1)).clamp_min(0)
    vectors = rest[:, None].expand(-1, width).clone()
    vectors[torch.arange(labels.shape[0], device=labels.device), labels] = scores.float()
    return vectors


def similarity(explained: DetectionVectors, proposed: DetectionVectors) -> torch.Tensor:
    """(K, M) s(d_t, d_j) = IoU(L_t, L_j) · cos(P_t, P_j) · O_j (module docstring); class vectors of different widths
    are compared with the narrower padded with zeros."""
    targets, found = explained.classes.float(), proposed.classes.float().to(explained.classes.device)
    width = max(targets.shape[1], found.shape[1])
    targets, found = F.pad(targets, (0, width - targets.shape[1])), F.pad(found, (0, width - found.shape[1]))
    cosine = F.normalize(targets, dim=1) @ F.normalize(found, dim=1).T
    ious: torch.Tensor = box_iou(explained.boxes.float(), proposed.boxes.float().to(explained.boxes.device))
    scores = ious * cosine
    if proposed.objectness is not None:
        scores = scores * proposed.objectness.float().to(scores.device)[None, :]
    return scores


def mask_weights(explained: DetectionVectors, proposed: DetectionVectors) -> torch.Tensor:
    """(K,) w^t = max_j s(d_t, d_j) over the masked image's detections, 0 where it has none."""
    count = explained.boxes.shape[0]
    if count == 0 or proposed.boxes.shape[0] == 0:
        return torch.zeros(count, device=explained.boxes.device)
    return similarity(explained, proposed).amax(dim=1)


def batch_weights(explained: DetectionVectors, proposed: list[DetectionVectors]) -> torch.Tensor:
    """(B, K) :func:`mask_weights` of each of B masked images at once: their detections joined, one
    :func:`similarity` of every explained detection with all of them, each image's best match taken over its own
    (0 where it has none)."""
    count, sizes = explained.boxes.shape[0], [int(found.boxes.shape[0]) for found in proposed]
    device = explained.boxes.device
    weights = torch.zeros(len(proposed), count, device=device)
    if count == 0 or sum(sizes) == 0:
        return weights
    width = max(int(found.classes.shape[1]) for found in proposed)
    has_objectness = any(found.objectness is not None for found in proposed)
    joined = DetectionVectors(
        torch.cat([found.boxes.float().to(device) for found in proposed]),
        torch.cat([F.pad(found.classes.float(), (0, width - found.classes.shape[1])).to(device) for found in proposed]),
        torch.cat([_objectness(found).to(device) for found in proposed]) if has_objectness else None,
    )
    owner = torch.repeat_interleave(torch.arange(len(proposed), device=device), torch.tensor(sizes, device=device))
    index = owner[:, None].expand(-1, count)
    return weights.scatter_reduce_(0, index, similarity(explained, joined).T, "amax", include_self=False)


def _objectness(found: DetectionVectors) -> torch.Tensor:
    """``found``'s objectness, 1 for every detection where it has none."""
    if found.objectness is None:
        return torch.ones(found.boxes.shape[0], device=found.boxes.device)
    return found.objectness.float().reshape(-1)


@dataclass(frozen=True)
class WeightedMasks:
    """One target's D-RISE sums: ``total`` (N, H, W) = sum_i w_i M_i over the ``masks`` masks, each cell kept with
    probability ``probability``."""

    total: torch.Tensor
    masks: int
    probability: float


class DetectionPasses:
    """D-RISE's masked passes for a batch: ``forward`` runs the model without hooks or autograd, ``inputs`` (N, 3, H,
    W), ``targets`` the explained detections; ``options`` say which masks. Every target's weighted sum of masks is
    accumulated in the one sweep over the masks, on the first :meth:`target` call; ``progress(done masks, total)``
    as for RISE."""

    def __init__(
        self,
        forward: Forward,
        inputs: torch.Tensor,
        targets: Proposed,
        options: PerturbationOptions | None = None,
        batch_size: int = 32,
        progress: Progress | None = None,
    ) -> None:
        self.forward, self.inputs, self.targets = forward, inputs, targets
        self.options = check_perturbation(options or PerturbationOptions())
        self.batch_size = max(1, batch_size)
        self.progress = progress
        self._totals: torch.Tensor | None = None

    @property
    def size(self) -> tuple[int, int]:
        return int(self.inputs.shape[-2]), int(self.inputs.shape[-1])

    def target(self, k: int) -> WeightedMasks:
        """Target ``k``'s sums (the last target: the combined one)."""
        if self._totals is None:
            self._totals = self._sweep()
        return WeightedMasks(self._totals[:, k], self.options.rise_masks, self.options.rise_probability)

    def masks(self) -> Iterator[torch.Tensor]:
        """The masks, in (B, H, W) batches of one forward pass's worth for the whole batch of inputs."""
        chunk = max(1, self.batch_size // int(self.inputs.shape[0]))
        return rise_masks(self.options, self.size, chunk, self.inputs.device)

    def weights(self, masks: torch.Tensor) -> torch.Tensor:
        """(B, H, W) masks -> (N, B, targets) weights w of every input, mask and target (module docstring)."""
        n, count, targets = int(self.inputs.shape[0]), int(masks.shape[0]), self.targets.count
        explained = [self.targets.explained_vectors(i) for i in range(n)]
        weights = torch.zeros(n, count, targets, device=self.inputs.device)
        pairs = torch.cartesian_prod(torch.arange(n), torch.arange(count)).view(-1, 2)
        for start in range(0, pairs.shape[0], self.batch_size):
            sample, mask = pairs[start : start + self.batch_size].unbind(dim=1)
            index = sample.to(self.inputs.device)
            masked = self.inputs[index] * masks[mask.to(masks.device)].unsqueeze(1).to(self.inputs.dtype)
            with torch.no_grad():
                found = self.targets.proposals(self.forward(masked))
            for i in sorted(set(sample.tolist())):  # every masked copy of input i scored in one similarity
                rows = (sample == i).nonzero().view(-1)
                own = batch_weights(explained[i], [found[row] for row in rows.tolist()]).to(weights.device)
                weights[i, mask[rows].to(weights.device), : own.shape[1]] = own
                weights[i, mask[rows].to(weights.device), targets - 1] = own.sum(dim=1)
        return weights

    def _sweep(self) -> torch.Tensor:
        """(N, targets, H, W) sum_i w_i M_i, one pass per mask and input (none where no image has a detection)."""
        total, done = self.options.rise_masks, 0
        totals = torch.zeros(self.inputs.shape[0], self.targets.count, *self.size, device=self.inputs.device)
        self._report(0, total)
        try:
            for masks in self.masks() if self.targets.count > 1 else ():  # no detection: no pass
                weights = self.weights(masks)
                totals += torch.einsum("nbk,bhw->nkhw", weights, masks.float())
                done += masks.shape[0]
                if done < total:
                    self._report(done, total)
        finally:
            self._report(total, total)
        return totals

    def _report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)
