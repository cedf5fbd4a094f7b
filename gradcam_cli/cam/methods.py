"""CAM methods: small pure functions from a layer's activations and gradients to a coarse saliency map.

Every method takes ``activations`` A and ``gradients`` g = dS^c/dA (S^c: the target class's logit) of shape
(N, C, h, w) and returns an (N, h, w) map, not yet upsampled or normalised (see
:func:`gradcam_cli.cam.maps.to_image_maps`). Most methods weight the channels, W_k = w_k * A^k, and end with
:func:`combine`: ReLU(sum_k W_k), or with ``eigen_smooth=True`` ReLU of the first principal component of the W_k
(see :mod:`gradcam_cli.cam.smoothing`). The table of methods, their papers and where they differ from
pytorch-grad-cam is in docs/methods.md.
Each method is registered in ``METHODS`` as a :class:`CamMethod`: its ``--method`` name, what it needs (the
backward pass; Score-CAM and AblationCAM also the model, as a :class:`MaskedScores` or an
:class:`~gradcam_cli.cam.ablation.AblatedScores`; FullGrad and the guided methods a pass through the whole network,
see :mod:`gradcam_cli.cam.fullgrad` and :mod:`gradcam_cli.cam.guided`), which tasks it serves, and what it costs.
FullGrad's and the guided methods' maps come at the network input's resolution, not the layer's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch

from ..errors import UsageError, suggest
from ..models.tasks import Task
from ..options import ALL_METHODS, METHOD_NAMES, TASK_NAMES
from .ablation import AblatedScores
from .attention.registered import attention_rollout, attn_grad, class_attention, layer_gradients
from .engine import as_logits
from .fullgrad import FullGradients, fullgrad_map
from .guided import guided_saliency
from .maps import Region, normalise, upsample, upsample_region
from .newer import fem, gradcam_elementwise, kpcacam, randomcam, shapleycam
from .perturbation import occlusion, rise
from .smoothing import combine, first_component

ProgressCallback = Callable[[int, int], object]
"""Called as ``progress(done, total)`` while Score-CAM's masked inputs run."""

SCORECAM_BATCH_SIZE = 32
"""Masked inputs per forward pass in Score-CAM, ablated copies in AblationCAM (``Explainer(score_batch_size=...)``)."""

MASKED, ABLATED, GUIDED, FULLGRAD, FINER = "masked", "ablated", "guided", "fullgrad", "finer"
HESSIAN, SEEDED, PERTURBED = "hessian", "seeded", "perturbed"
ATTENTION, ATTENTION_GRADIENTS, LAYER_SCORES = "attention", "attention-gradients", "layer-scores"
ATTENTION_NEEDS = (ATTENTION, ATTENTION_GRADIENTS, LAYER_SCORES)
"""What a method takes as third argument (:attr:`CamMethod.extra`): a :class:`MaskedScores`, an
:class:`~gradcam_cli.cam.ablation.AblatedScores`, the target's guided (N, 3, H, W) input gradient
(:class:`~gradcam_cli.cam.guided.GuidedPass`), its :class:`~gradcam_cli.cam.fullgrad.FullGradients`, the
layer's gradient of the target's Finer-CAM score (:mod:`gradcam_cli.cam.finer`), the Hessian-vector product H A of
the layer (ShapleyCAM), a seed (randomcam), or the black-box :class:`~gradcam_cli.cam.perturbation.MaskedPasses`
(RISE, occlusion), or the explained pass's :class:`~gradcam_cli.cam.attention.tokens.AttentionMaps` (without or
with the target's gradients: the attention methods)."""


@dataclass(frozen=True)
class CamMethod:
    """One registered method: its ``--method`` name, the pure function that computes its coarse map, what that
    function needs besides the activations (``uses_gradients``: the backward pass to the layer, one per target,
    shared by all such methods; ``extra``: a third argument, see :data:`MASKED`), whether one map serves every target
    (``class_agnostic``), the tasks it explains (``tasks``: names of :data:`gradcam_cli.options.TASK_NAMES`), and
    whether it reads a layer at all (``uses_layer``: RISE and occlusion do not; their maps come at the network
    input's resolution, and they are given ``None`` for the activations and gradients)."""

    name: str
    compute: Callable[..., torch.Tensor]
    uses_gradients: bool = True
    extra: str | None = None
    class_agnostic: bool = False
    tasks: tuple[str, ...] = TASK_NAMES
    uses_layer: bool = True

    @property
    def uses_model(self) -> bool:
        """Whether the method runs the model again on altered inputs or activations (Score-CAM, AblationCAM, RISE,
        occlusion)."""
        return self.extra in (MASKED, ABLATED, PERTURBED)

    @property
    def reads_every_layer(self) -> bool:
        """Whether the method reads layers besides the explained ones (FullGrad: every bias and its gradient), so
        that folding batch norms into convolutions would change its maps."""
        return self.extra in (FULLGRAD, *ATTENTION_NEEDS)


def _spatial_sum(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.sum(dim=(2, 3), keepdim=True)


def gradcam(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """Grad-CAM (Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks", ICCV 2017).

    w_k = mean_{i,j} g^k_{ij};  L = ReLU(sum_k w_k A^k).
    """
    weights = gradients.mean(dim=(2, 3), keepdim=True)
    return combine(weights * activations, eigen_smooth)


def gradcam_plus_plus(
    activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Grad-CAM++ (Chattopadhay et al., "Grad-CAM++: Improved Visual Explanations for Deep Convolutional
    Networks", WACV 2018), Eq. 19 with the exponential score Y^c = exp(S^c) of Sec. 3.3.

    alpha^k_{ij} = g_{ij}^2 / (2 g_{ij}^2 + sum_{a,b} A^k_{ab} g_{ij}^3)  (zero where that denominator is zero);
    w_k = sum_{i,j} alpha^k_{ij} ReLU(g^k_{ij});  L = ReLU(sum_k w_k A^k).

    With Y = exp(S) and a piecewise-linear network, dY/dA = exp(S) g, d2Y/dA2 = exp(S) g^2, d3Y/dA3 = exp(S) g^3:
    exp(S) cancels in alpha and scales every w_k alike, so it vanishes once the map is normalised. The sum in the
    denominator is over the *activations* only (sum_ab A_ab times g_ij^3); implementations that sum
    A_ab * g_ab^3 instead get Eq. 19 wrong. alpha is evaluated as 1 / (2 + g_ij sum_ab A_ab) for g_ij != 0, the
    same quotient without the g^2 and g^3 that underflow for small gradients; pytorch-grad-cam instead adds 1e-6 to
    the denominator, which dominates 2 g^2 when |g| < ~1e-3 (as with random weights) and changes the map there.
    """
    totals = _spatial_sum(activations)
    denominator = 2 + totals * gradients
    usable = (gradients != 0) & (denominator != 0)
    alpha = torch.where(usable, 1 / torch.where(usable, denominator, torch.ones_like(denominator)), 0.0)
    weights = _spatial_sum(alpha * torch.relu(gradients))
    return combine(weights * activations, eigen_smooth)


def xgradcam(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """XGrad-CAM (Fu et al., "Axiom-based Grad-CAM: Towards Accurate Visualization and Explanation of CNNs",
    BMVC 2020).

    w_k = sum_{i,j} (A^k_{ij} / sum_{a,b} A^k_{ab}) g^k_{ij}  (zero for a channel whose activations sum to 0);
    L = ReLU(sum_k w_k A^k).
    """
    totals = _spatial_sum(activations)
    safe = torch.where(totals != 0, totals, torch.ones_like(totals))
    weights = torch.where(totals != 0, _spatial_sum(gradients * activations) / safe, 0.0)
    return combine(weights * activations, eigen_smooth)


def hirescam(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """HiResCAM (Draelos & Carin, "Use HiResCAM instead of Grad-CAM for faithful explanations of convolutional
    neural networks", arXiv:2011.08891, 2020).

    L = ReLU(sum_k g^k ⊙ A^k): the gradient multiplies each position instead of being averaged first. (With
    eigen-smooth the map is no longer the exact score decomposition the paper proves.)
    """
    return combine(gradients * activations, eigen_smooth)


def layercam(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """LayerCAM (Jiang et al., "LayerCAM: Exploring Hierarchical Class Activation Maps for Localization",
    IEEE TIP 30, 2021).

    L = ReLU(sum_k ReLU(g^k) ⊙ A^k): only positive gradients count, position by position.
    """
    return combine(torch.relu(gradients) * activations, eigen_smooth)


def eigencam(
    activations: torch.Tensor, gradients: torch.Tensor | None = None, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Eigen-CAM (Muhammad & Yeasin, "Eigen-CAM: Class Activation Map using Principal Components", IJCNN 2020).

    L = ReLU(A_c v_1): the activations' first principal component, where A_c is the (h*w, C) activation matrix
    with each channel centred (as pytorch-grad-cam does; the paper decomposes A itself) and v_1 its first right
    singular vector, signed so that its loadings sum positive (the map correlates with sum_k A^k; pytorch-grad-cam
    leaves the sign to the SVD routine). Class-agnostic: no gradients, one map for every target.
    ``eigen_smooth`` changes nothing: the map already is a first principal component.
    """
    return torch.relu(first_component(activations))


class MaskedScores:
    """Score-CAM's extra forward passes: the target class's probability for the input masked by each channel.

    ``forward`` runs the model on a batch (without hooks or autograd); ``inputs`` (N, 3, H, W) are the inputs
    being explained and ``targets`` (N,) their target classes, whose softmax probability is read from the logits;
    or else ``probability(output, samples)`` reads the (B,) probability of the target of each masked input's
    sample from the model's output (a detector's matched detection: see :mod:`gradcam_cli.cam.scores`).
    ``region``: the part of the maps that shows the input (a detector's padded batch, see
    :func:`gradcam_cli.cam.maps.upsample_region`). Masked inputs run ``batch_size`` at a time;
    ``progress(done, total)`` is called before the first batch and after each one, the last time with
    ``done == total`` even if a pass fails (nothing is printed otherwise).
    Channels whose map is constant are skipped (their weight is 0), as the authors' code does.
    """

    def __init__(
        self,
        forward: Callable[[torch.Tensor], object],
        inputs: torch.Tensor,
        targets: torch.Tensor | None = None,
        batch_size: int = SCORECAM_BATCH_SIZE,
        progress: ProgressCallback | None = None,
        probability: Callable[[object, torch.Tensor], torch.Tensor] | None = None,
        region: Region = (1.0, 1.0),
    ) -> None:
        if targets is None and probability is None:
            raise ValueError("MaskedScores needs targets or a probability function")
        self.forward = forward
        self.inputs = inputs
        self.targets = targets.view(-1) if targets is not None else None
        self.batch_size = max(1, batch_size)
        self.progress = progress
        self.probability = probability
        self.region = region

    def __call__(self, activations: torch.Tensor) -> torch.Tensor:
        """(N, C, h, w) activations -> (N, C) probabilities p(target | input ⊙ mask_k)."""
        flat = activations.flatten(2)
        varying = (flat.amax(dim=2) > flat.amin(dim=2)).nonzero()  # (P, 2): (sample, channel) pairs
        scores = torch.zeros(activations.shape[:2], device=activations.device, dtype=torch.float32)
        total = varying.shape[0]
        self._report(0, total)
        try:
            for start in range(0, total, self.batch_size):
                sample, channel = varying[start : start + self.batch_size].unbind(dim=1)
                masks = scorecam_masks(activations[sample, channel], self.inputs.shape[-2:], self.region)
                with torch.no_grad():
                    output = self.forward(self.inputs[sample] * masks.unsqueeze(1).to(self.inputs.dtype))
                    scores[sample, channel] = self._probabilities(output, sample)
                if start + self.batch_size < total:
                    self._report(start + self.batch_size, total)
        finally:
            self._report(total, total)  # always the last call, also on errors, so that a bar can close
        return scores

    def _probabilities(self, output: object, sample: torch.Tensor) -> torch.Tensor:
        """(B,) probability of each masked input's target."""
        if self.probability is not None:
            return self.probability(output, sample).float()
        assert self.targets is not None
        probabilities = as_logits(output).float().softmax(dim=1)
        return probabilities.gather(1, self.targets[sample].unsqueeze(1)).squeeze(1)

    def _report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)


def scorecam_masks(maps: torch.Tensor, size: tuple[int, int] | torch.Size, region: Region = (1.0, 1.0)) -> torch.Tensor:
    """Score-CAM's masks H^k: each (h, w) map bilinearly upsampled to the input ``size`` and min-max scaled to
    [0, 1]: (B, h, w) -> (B, H, W). ``region``: the part of the maps that shows the input."""
    return normalise(upsample_region(maps, size, region))


def scorecam(
    activations: torch.Tensor,
    gradients: torch.Tensor | None,
    model: MaskedScores,
    *,
    eigen_smooth: bool = False,
) -> torch.Tensor:
    """Score-CAM (Wang et al., "Score-CAM: Score-Weighted Visual Explanations for Convolutional Neural Networks",
    CVPR Workshops 2020).

    H^k = minmax(Up(A^k));  w_k = softmax(f(X ⊙ H^k))_c;  L = ReLU(sum_k w_k A^k).

    The weight is the target class's softmax probability for the input masked by channel k, as in the authors'
    code (github.com/haofanwang/Score-CAM); the paper's baseline term f(X_b) is left out, as there. pytorch-grad-cam
    instead applies a softmax across the channels to the raw target logits (and upsamples the masks with
    align_corners=True), which weights channels differently. Costs one forward pass per non-constant channel; no
    gradients.
    """
    weights = model(activations).to(activations.dtype)
    return combine(weights[:, :, None, None] * activations, eigen_smooth)


def eigengradcam(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """Eigen-Grad-CAM (pytorch-grad-cam's ``EigenGradCAM``, J. Gildenblat et al., 2021): Eigen-CAM (Muhammad &
    Yeasin, IJCNN 2020) of the gradient-weighted activations, which makes it class-discriminative.

    L = ReLU(first principal component of g ⊙ A): the (h*w, C) matrix of g^k_ij A^k_ij with each channel centred,
    projected on its first right singular vector, signed so that the map correlates positively with
    sum_k g^k ⊙ A^k (pytorch-grad-cam keeps the sign the SVD returns). ``eigen_smooth`` changes nothing.
    """
    return combine(gradients * activations, eigen_smooth=True)


def ablationcam(
    activations: torch.Tensor, gradients: torch.Tensor | None, model: AblatedScores, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Ablation-CAM (Desai & Ramaswamy, "Ablation-CAM: Visual Explanations for Deep Convolutional Network via
    Gradient-free Localization", WACV 2020).

    w_k = (y^c - y^c_k) / y^c, y^c_k the target's score with channel k of the layer set to zero;
    L = ReLU(sum_k w_k A^k). y^c is the score ``--score`` names (the logit by default, as in the paper and
    pytorch-grad-cam); where it is 0, w_k = y^c - y^c_k. pytorch-grad-cam sets an ablated channel to
    min(A) - 1e7 instead of 0 whenever the batch's activations are not all >= 0 with minimum exactly 0 (SiLU,
    Hardswish, LayerNorm outputs), which departs from the paper there. One forward pass per non-zero channel, in
    batches; no gradients.
    """
    ablated = model(activations)
    original = model.original.to(ablated.device)[:, None]
    drop = original - ablated
    weights = torch.where(original != 0, drop / torch.where(original != 0, original, torch.ones_like(original)), drop)
    return combine(weights[:, :, None, None].to(activations.dtype) * activations, eigen_smooth)


def fullgrad(
    activations: torch.Tensor, gradients: torch.Tensor | None, full: FullGradients, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """FullGrad (Srinivas & Fleuret, "Full-Gradient Representation for Neural Network Visualization", NeurIPS
    2019, Eq. 5, as pytorch-grad-cam's ``FullGrad`` computes it).

    L = sum_c psi(|x ⊙ ∇_x S|_c) + sum_l sum_c psi(|b_l,c ∂S/∂z_l,c|): the input-gradient term and, for every
    convolution with a bias and every BatchNorm (z_l its output, b_l its bias), the bias-gradient term, psi being
    min-max normalisation per channel at the layer's resolution followed by bilinear upsampling to the input.
    ``--layer`` plays no part (every bias layer counts); ``eigen_smooth`` changes nothing. See
    :mod:`gradcam_cli.cam.fullgrad`.
    """
    return fullgrad_map(full)


def guided_backprop(
    activations: torch.Tensor, gradients: torch.Tensor | None, guided: torch.Tensor, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Guided backpropagation (Springenberg et al., "Striving for Simplicity: The All Convolutional Net", ICLR
    workshop 2015), as Guided Grad-CAM uses it (Selvaraju et al., ICCV 2017).

    G = dS/dx with every ReLU passing back only positive gradients (see :mod:`gradcam_cli.cam.guided`);
    L = sum_c |G_c| at the input's resolution, clipped at its 99th percentile for display. The layer plays no
    part; ``eigen_smooth`` changes nothing.
    """
    return guided_saliency(guided)


def guided_gradcam(
    activations: torch.Tensor, gradients: torch.Tensor, guided: torch.Tensor, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Guided Grad-CAM (Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks", ICCV 2017, Sec. 3.1).

    G ⊙ Up(Grad-CAM): the guided-backpropagation gradient G times the Grad-CAM map bilinearly upsampled to the
    input and normalised to [0, 1] (as pytorch-grad-cam's example does); L = sum_c |G_c ⊙ Up(Grad-CAM)|, clipped at
    its 99th percentile for display (see :func:`guided_backprop`). ``eigen_smooth`` applies to the Grad-CAM part.
    """
    cam = normalise(upsample(gradcam(activations, gradients, eigen_smooth=eigen_smooth), guided.shape[-2:]))
    return guided_saliency(guided * cam[:, None].to(guided.dtype))


def finercam(
    activations: torch.Tensor, gradients: torch.Tensor | None, finer: torch.Tensor, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Finer-CAM (Zhang et al., "Finer-CAM: Spotting the Difference Reveals Finer Details for Visual Explanation",
    CVPR 2025): Grad-CAM of the target's score minus its nearest classes' (:mod:`gradcam_cli.cam.finer`), with
    ``finer`` = dS/dA for that score S.

    w_k = mean_{i,j} dS/dA^k_{ij};  L = ReLU(sum_k w_k A^k).
    """
    return gradcam(activations, finer, eigen_smooth=eigen_smooth)


CLASSIFY: tuple[str, ...] = ("classify",)


METHODS: dict[str, CamMethod] = {
    method.name: method
    for method in (
        CamMethod("gradcam", gradcam),
        CamMethod("gradcam++", gradcam_plus_plus),
        CamMethod("xgradcam", xgradcam),
        CamMethod("hirescam", hirescam),
        CamMethod("layercam", layercam),
        CamMethod("scorecam", scorecam, uses_gradients=False, extra=MASKED),
        CamMethod("eigencam", eigencam, uses_gradients=False, class_agnostic=True),
        CamMethod("eigengradcam", eigengradcam),
        CamMethod("ablationcam", ablationcam, uses_gradients=False, extra=ABLATED, tasks=CLASSIFY),
        CamMethod("fullgrad", fullgrad, uses_gradients=False, extra=FULLGRAD, tasks=CLASSIFY),
        CamMethod("guided-backprop", guided_backprop, uses_gradients=False, extra=GUIDED, tasks=CLASSIFY),
        CamMethod("guided-gradcam", guided_gradcam, extra=GUIDED, tasks=CLASSIFY),
        CamMethod("finercam", finercam, uses_gradients=False, extra=FINER, tasks=CLASSIFY),
        CamMethod("gradcam-elementwise", gradcam_elementwise),
        CamMethod("kpcacam", kpcacam, uses_gradients=False, class_agnostic=True),
        CamMethod("shapleycam", shapleycam, extra=HESSIAN, tasks=("classify", "segment")),
        CamMethod("fem", fem, uses_gradients=False, class_agnostic=True),
        CamMethod("randomcam", randomcam, uses_gradients=False, extra=SEEDED, class_agnostic=True),
        CamMethod("rise", rise, uses_gradients=False, extra=PERTURBED, uses_layer=False),
        CamMethod("occlusion", occlusion, uses_gradients=False, extra=PERTURBED, uses_layer=False),
        CamMethod("rollout", attention_rollout, False, ATTENTION, True, CLASSIFY, uses_layer=False),
        CamMethod("attn-grad", attn_grad, False, ATTENTION_GRADIENTS, tasks=CLASSIFY, uses_layer=False),
        CamMethod("attention", class_attention, False, ATTENTION, True, CLASSIFY, uses_layer=False),
        CamMethod("legrad", layer_gradients, False, LAYER_SCORES, tasks=CLASSIFY, uses_layer=False),
    )
}
"""Every method, by the name ``--method`` accepts, in :data:`gradcam_cli.options.METHOD_NAMES` order."""
if tuple(METHODS) != METHOD_NAMES:  # the parser validates --method against METHOD_NAMES without importing torch
    raise ImportError(f"METHODS {tuple(METHODS)} and options.METHOD_NAMES {METHOD_NAMES} disagree")


def resolve_methods(names: Sequence[str], task: str, also: Collection[str] = ()) -> list[str]:
    """``names`` checked against :data:`METHODS` and ``task`` (a one-line :class:`UsageError` for a name that is
    not a method or a method that does not serve the task); ``all`` (:data:`~gradcam_cli.options.ALL_METHODS`)
    stands for every method that serves the task, in registry order. ``also``: methods that serve this model
    although not its task (a YOLO detector's AblationCAM)."""
    for name in names:
        if name not in METHODS and name != ALL_METHODS:
            raise UsageError(f"unknown method {name!r}.{suggest(name, METHODS)}")
    if ALL_METHODS in names:
        names = [name for name, method in METHODS.items() if task in method.tasks or name in also]
    for name in names:
        if task not in METHODS[name].tasks and name not in also:
            kinds = " and ".join(f"{Task(kind).noun}s" for kind in METHODS[name].tasks)
            taken = ", ".join(other for other, method in METHODS.items() if task in method.tasks)
            raise UsageError(f"--method {name} is for {kinds}; a {Task(task).noun} takes {taken}")
    return list(names)
