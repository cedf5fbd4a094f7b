"""Tiny seeded volume models for the sliding-window tests: a 3-D segmenter (N, 1, D, H, W) -> (N, 3, D, H, W) with a
bottleneck at half resolution, a 3-D classifier, volumes with bright blobs in noise, and the sliding-window Grad-CAM
reference: a forward hook and ``torch.autograd.grad`` per window, nnU-Net's own windows and Gaussian."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.profile import LoadedModel

CLASSES = ("background", "bright", "dark")


class TinySegmenter(nn.Module):
    """stem (full resolution) -> down (stride 2) -> bottleneck -> upsampled, concatenated with the stem -> head."""

    def __init__(self, channels: int = 1, classes: int = len(CLASSES)) -> None:
        super().__init__()
        self.stem = nn.Conv3d(channels, 4, 3, padding=1)
        self.down = nn.Conv3d(4, 8, 3, stride=2, padding=1)
        self.bottleneck = nn.Conv3d(8, 8, 3, padding=1)
        self.head = nn.Conv3d(12, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.stem(x))
        b = F.relu(self.bottleneck(F.relu(self.down(a))))
        up = F.interpolate(b, size=a.shape[2:], mode="trilinear", align_corners=False)
        return self.head(torch.cat([up, a], dim=1))


def segmenter(seed: int = 0) -> TinySegmenter:
    torch.manual_seed(seed)
    return TinySegmenter().eval()


def classifier(seed: int = 0) -> nn.Module:
    """A 3-D classifier: (N, 1, D, H, W) -> (N, 4); its layer ``2`` gives (N, 8, D/2, H/2, W/2) maps."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv3d(1, 6, 3, padding=1),
        nn.ReLU(),
        nn.Conv3d(6, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool3d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    ).eval()


def loaded(module: nn.Module, patch: tuple[int, int, int], name: str = "tiny") -> LoadedModel:
    """``module`` as a volume segmenter of 1-channel (D, H, W) windows of ``patch``."""
    return LoadedModel(module, name, "random", list(CLASSES), InputSpec(shape=(1, *patch)), task="segment")


def volume(shape: tuple[int, int, int] = (20, 26, 30), seed: int = 1) -> torch.Tensor:
    """(1, D, H, W): noise with a bright blob and a dark one."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, *shape, generator=generator) * 0.3
    grid = torch.stack(torch.meshgrid(*[torch.arange(s, dtype=torch.float32) for s in shape], indexing="ij"))
    for centre, value in (((0.3, 0.3, 0.6), 2.0), ((0.7, 0.6, 0.3), -2.0)):
        c = torch.tensor([p * s for p, s in zip(centre, shape, strict=True)]).view(3, 1, 1, 1)
        x[0] += value * torch.exp(-((grid - c) ** 2).sum(0) / 8.0)
    return x


def grad_cam_of_window(model: nn.Module, layer: nn.Module, x: torch.Tensor, c: int, mask=None) -> torch.Tensor:
    """Grad-CAM (Selvaraju et al.) of one (1, C, d, h, w) window for class ``c``'s logits summed over the voxels
    predicted as ``c`` (or ``mask``'s), at the layer's resolution, unnormalised; zeros where no voxel counts."""
    kept: list[torch.Tensor] = []

    def keep(_module: nn.Module, _inputs: object, output: torch.Tensor) -> torch.Tensor:
        kept.append(output.detach().requires_grad_(True))
        return kept[-1]

    handle = layer.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            logits = model(x)
            where = logits.argmax(dim=1)[0] == c if mask is None else mask
            if not where.any():
                return torch.zeros(kept[-1].shape[2:], dtype=torch.float64)
            (g,) = torch.autograd.grad(logits[0, c][where].sum(), kept[-1])
    finally:
        handle.remove()
    a, g = kept[-1].detach().double()[0], g.double()[0]
    return torch.relu((g.mean(dim=(1, 2, 3), keepdim=True) * a).sum(dim=0))


def reference_stitched(
    model: nn.Module, layer: nn.Module, x: torch.Tensor, c: int, patch=(12, 12, 12), step: float = 0.5
) -> torch.Tensor:
    """nnU-Net's windows and Gaussian (its own functions), each window's Grad-CAM upsampled trilinearly to the
    patch, stitched with the Gaussian, min-max normalised over the volume."""
    from nnunetv2.inference import sliding_window_prediction as nnunet_windows

    steps = nnunet_windows.compute_steps_for_sliding_window(x.shape[1:], patch, step)
    g = nnunet_windows.compute_gaussian(patch, 1 / 8, 1, dtype=torch.float64, device=torch.device("cpu"))
    total = torch.zeros(x.shape[1:], dtype=torch.float64)
    summed = torch.zeros(x.shape[1:], dtype=torch.float64)
    for z in steps[0]:
        for y in steps[1]:
            for w in steps[2]:
                s = (slice(z, z + patch[0]), slice(y, y + patch[1]), slice(w, w + patch[2]))
                cam = grad_cam_of_window(model, layer, x[(slice(None), *s)][None], c)
                up = F.interpolate(cam[None, None], size=patch, mode="trilinear", align_corners=False)[0, 0]
                summed[s] += up * g
                total[s] += g
    stitched = summed / total
    return (stitched - stitched.min()) / (stitched.max() - stitched.min())


NNUNET_LABELS = {"background": 0, "liver": 1, "tumour": 2}
CT_PROPERTIES = {"mean": 80.0, "std": 150.0, "percentile_00_5": -900.0, "percentile_99_5": 1200.0}


def nnunet_plans(patch: tuple[int, int, int] = (16, 16, 16)) -> dict:
    """A tiny 3d_fullres nnU-Net v2 plans file: a 3-stage PlainConvUNet, CT normalisation."""
    stages = 3
    return {
        "dataset_name": "Dataset999_Tiny",
        "plans_name": "nnUNetPlans",
        "transpose_forward": [0, 1, 2],
        "transpose_backward": [0, 1, 2],
        "configurations": {
            "3d_fullres": {
                "data_identifier": "nnUNetPlans_3d_fullres",
                "preprocessor_name": "DefaultPreprocessor",
                "batch_size": 2,
                "patch_size": list(patch),
                "spacing": [2.5, 0.8, 0.8],
                "normalization_schemes": ["CTNormalization"],
                "use_mask_for_norm": [False],
                "architecture": {
                    "network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
                    "arch_kwargs": {
                        "n_stages": stages,
                        "features_per_stage": [4, 8, 16],
                        "conv_op": "torch.nn.modules.conv.Conv3d",
                        "kernel_sizes": [[3, 3, 3]] * stages,
                        "strides": [[1, 1, 1], [2, 2, 2], [2, 2, 2]],
                        "n_conv_per_stage": [1] * stages,
                        "n_conv_per_stage_decoder": [1] * (stages - 1),
                        "conv_bias": True,
                        "norm_op": "torch.nn.modules.instancenorm.InstanceNorm3d",
                        "norm_op_kwargs": {"eps": 1e-05, "affine": True},
                        "dropout_op": None,
                        "dropout_op_kwargs": None,
                        "nonlin": "torch.nn.LeakyReLU",
                        "nonlin_kwargs": {"inplace": True},
                    },
                    "_kw_requires_import": ["conv_op", "norm_op", "dropout_op", "nonlin"],
                },
            },
            "3d_fullres_bs4": {"inherits_from": "3d_fullres", "batch_size": 4},
        },
        "foreground_intensity_properties_per_channel": {"0": {**CT_PROPERTIES, "median": 70.0, "min": -1000.0}},
    }


def nnunet_network(plans: dict, configuration: str = "3d_fullres", seed: int = 0) -> nn.Module:
    """The plans' network built by nnU-Net's own ``get_network_from_plans``, seeded, its own initialisation; where
    nnunetv2 is not installed (``make install`` leaves it out), as that function builds it: the plans' class from
    dynamic-network-architectures with its imported arguments, He-initialised by the network's own ``initialize``
    (the weights then differ, the architecture does not: the tests that compare builds skip without nnunetv2)."""
    import pydoc

    torch.manual_seed(seed)
    architecture = plans["configurations"][configuration]["architecture"]
    try:
        from nnunetv2.utilities.get_network_from_plans import get_network_from_plans
    except ImportError:
        kwargs = dict(architecture["arch_kwargs"])
        for key in architecture["_kw_requires_import"]:
            if kwargs[key] is not None:
                kwargs[key] = pydoc.locate(kwargs[key])
        network_class: Any = pydoc.locate(architecture["network_class_name"])
        network = network_class(input_channels=1, num_classes=len(NNUNET_LABELS), deep_supervision=False, **kwargs)
        if hasattr(network, "initialize"):
            network.apply(network.initialize)
        return network.eval()
    return get_network_from_plans(
        architecture["network_class_name"],
        architecture["arch_kwargs"],
        architecture["_kw_requires_import"],
        1,
        len(NNUNET_LABELS),
        deep_supervision=False,
    ).eval()


def save_nnunet_folder(root, seed: int = 0, folds: tuple[str, ...] = ("fold_0",)):
    """A trained nnU-Net v2 model folder as nnU-Net writes it (plans, dataset.json, fold_N/checkpoint_final.pth with
    the trainer's keys: numpy scalars in its log, a torch.device in its init_args); returns (folder, network)."""
    import json

    import numpy as np

    folder = root / "Dataset999_Tiny" / "nnUNetTrainer__nnUNetPlans__3d_fullres"
    folder.mkdir(parents=True)
    plans = nnunet_plans()
    dataset = {"channel_names": {"0": "CT"}, "labels": NNUNET_LABELS, "numTraining": 4, "file_ending": ".nii.gz"}
    (folder / "plans.json").write_text(json.dumps(plans))
    (folder / "dataset.json").write_text(json.dumps(dataset))
    network = nnunet_network(plans, seed=seed)
    for fold in folds:
        (folder / fold).mkdir()
        checkpoint = {
            "network_weights": network.state_dict(),
            "optimizer_state": {},
            "grad_scaler_state": None,
            "logging": {"ema_fg_dice": [np.float64(0.25)], "mean_fg_dice": [np.float32(0.5)]},
            "_best_ema": np.float64(0.25),
            "current_epoch": 1,
            "init_args": {
                "plans": plans,
                "configuration": "3d_fullres",
                "fold": 0,
                "dataset_json": dataset,
                "device": torch.device("cpu"),
            },
            "trainer_name": "nnUNetTrainer",
            "inference_allowed_mirroring_axes": (0, 1, 2),
        }
        torch.save(checkpoint, folder / fold / "checkpoint_final.pth")
    return folder, network


BUNDLE_BOTTLENECK = "model.1.submodule.1.submodule"
BUNDLE_CONFIG = {
    "bundle_root": ".",
    "num_classes": 3,
    "network_def": {
        "_target_": "UNet",
        "spatial_dims": 3,
        "in_channels": 1,
        "out_channels": "@num_classes",
        "channels": [4, 8, 16],
        "strides": [2, 2],
        "num_res_units": 0,
    },
    "network": "$@network_def.to('cpu')",
    "preprocessing": {
        "_target_": "Compose",
        "transforms": [
            {"_target_": "LoadImaged", "keys": "image"},
            {"_target_": "EnsureChannelFirstd", "keys": "image"},
            {"_target_": "Orientationd", "keys": "image", "axcodes": "RAS"},
            {"_target_": "Spacingd", "keys": "image", "pixdim": [1.5, 1.5, 2.0]},
            {
                "_target_": "ScaleIntensityRanged",
                "keys": "image",
                "a_min": -57,
                "a_max": 164,
                "b_min": 0.0,
                "b_max": 1.0,
                "clip": True,
            },
        ],
    },
    "inferer": {"_target_": "SlidingWindowInferer", "roi_size": [16, 16, 16], "sw_batch_size": 2, "overlap": "$0.25"},
}
BUNDLE_METADATA = {
    "version": "0.1.0",
    "network_data_format": {
        "inputs": {"image": {"type": "image", "num_channels": 1, "spatial_shape": [16, 16, 16]}},
        "outputs": {
            "pred": {
                "type": "image",
                "num_channels": 3,
                "channel_def": {"0": "background", "1": "spleen", "2": "liver"},
            }
        },
    },
}


def bundle_network() -> nn.Module:
    """The tiny bundle's network: a MONAI 3-D UNet (1 channel in, 3 classes), seeded."""
    from monai.networks.nets import UNet

    torch.manual_seed(0)
    return UNet(3, 1, 3, channels=(4, 8, 16), strides=(2, 2), num_res_units=0).eval()


def save_bundle(root):
    """A tiny MONAI bundle folder as the model zoo lays one out (configs/inference.json, configs/metadata.json,
    models/model.pt); returns (folder, network)."""
    import json

    folder = root / "spleen_bundle"
    (folder / "configs").mkdir(parents=True)
    (folder / "models").mkdir()
    (folder / "configs" / "inference.json").write_text(json.dumps(BUNDLE_CONFIG))
    (folder / "configs" / "metadata.json").write_text(json.dumps(BUNDLE_METADATA))
    net = bundle_network()
    torch.save(net.state_dict(), folder / "models" / "model.pt")
    return folder, net


CT_SHAPE = (18, 22, 26)
CT_AFFINE = np.array([[-0.8, 0.0, 0.0, 10.0], [0.0, 0.9, 0.0, -20.0], [0.0, 0.0, 2.5, 5.0], [0.0, 0.0, 0.0, 1.0]])
"""The command-line tests' scan: its grid, anisotropic and x-flipped."""


def save_ct_scan(path: Path) -> Path:
    """A CT-like NIfTI at ``path`` (HU around 50, a bright and a dark blob) on :data:`CT_AFFINE`'s grid."""
    import nibabel

    values = volume(CT_SHAPE)[0].numpy() * 300 + 50
    nibabel.save(nibabel.Nifti1Image(values.astype(np.float32), CT_AFFINE), path)
    return path
