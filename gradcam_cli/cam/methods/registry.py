"""The method registry: one typed :class:`CamMethod` per method, in :data:`METHODS`, a
:class:`~gradcam_cli.registry.Registry` that third-party packages add to through the ``gradcam_cli.methods`` entry
points and a notebook through :func:`register_method`.

A method's ``compute`` takes the layer's (N, C, h, w) ``activations`` and ``gradients`` (``None`` for a method that
takes no backward pass) and, when the method has a :class:`~gradcam_cli.cam.methods.needs.Need`, the value that need
builds (:mod:`gradcam_cli.cam.passes`), and returns the coarse (N, h, w) map; a method whose ``ranks`` take grids of
other ranks is given (N, C, t, h, w) or (N, C, l) and returns (N, t, h, w) or (N, l). The constructor's overloads tie
the function's signature to the need's type, so the type checker sees each registration's signature.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar, overload

import torch

from ...errors import UsageError, suggest
from ...models.tasks import NOUNS
from ...options import ALL_METHODS, TASK_NAMES
from ...registry import METHODS_GROUP, Registry
from ..maps import Fusion
from .needs import Need

if TYPE_CHECKING:
    from typing_extensions import Unpack

E = TypeVar("E")
E_contra = TypeVar("E_contra", contravariant=True)

CLASSIFY: tuple[str, ...] = ("classify",)
"""The tasks of a method for classifiers only."""
SEGMENT: tuple[str, ...] = ("segment",)
"""The tasks of a method for segmenters only (Seg-Eigen-CAM)."""
IMAGE_MAPS: tuple[int, ...] = (2,)
"""The spatial ranks of a method defined for 2-D maps only (a method's default)."""
ANY_RANK: tuple[int, ...] = (1, 2, 3)
"""The spatial ranks of a method whose formula holds on any grid: (L,) sequences, (H, W) images, (T, H, W) clips and
(D, H, W) volumes."""


class LayerMap(Protocol):
    """A method with no extra input: ``(activations, gradients, *, eigen_smooth) -> map``."""

    def __call__(
        self, activations: torch.Tensor, gradients: torch.Tensor, /, *, eigen_smooth: bool = False
    ) -> torch.Tensor: ...


class LayerMapWith(Protocol[E_contra]):
    """A method with one extra input of type ``E_contra``: ``(activations, gradients, extra, *, eigen_smooth) ->
    map``."""

    def __call__(
        self, activations: torch.Tensor, gradients: torch.Tensor, extra: E_contra, /, *, eigen_smooth: bool = False
    ) -> torch.Tensor: ...


class MethodRow(TypedDict, total=False):
    """A method's row of the table in docs/methods.md: its formula, its paper and its cost (each text), and the
    spatial ranks of the maps its formula is defined for (its ``grids`` column; default :data:`IMAGE_MAPS`); and
    what its formula says of several layers: how their maps make one (``fusion``, default ``mean``:
    :data:`~gradcam_cli.cam.maps.Fusion`) and how many of the model's last stages it reads where it is given one
    layer or none (``stages``, default 1: that layer alone; :func:`~gradcam_cli.cam.layers.stage_layers`)."""

    formula: str
    paper: str
    cost: str
    ranks: tuple[int, ...]
    fusion: Fusion
    stages: int


class CamMethod(Generic[E]):
    """One registered method: its ``--method`` name, the function that computes its coarse map (formula and paper in
    its docstring), what that function needs besides the activations (``uses_gradients``: the backward pass to the
    layer, one per target, shared by all such methods; ``needs``: an extra input, a
    :class:`~gradcam_cli.cam.methods.needs.Need`), whether one map serves every target (``class_agnostic``), the
    tasks it explains (``tasks``: names of :data:`gradcam_cli.options.TASK_NAMES`), and whether it reads a layer at
    all (``uses_layer``: RISE and occlusion do not; their maps come at the network input's resolution, and they are
    given ``None`` for the activations and gradients). ``needs_target``: false for a method that reads the model
    alone, never a target's score (rollout, the last layer's attention), so that it also explains an embedding model
    given no ``--target`` (:mod:`gradcam_cli.cam.untargeted`). ``formula``, ``paper`` and ``cost``: its row of the
    table in docs/methods.md (:func:`gradcam_cli.cam.methods.table.methods_table`); ``ranks``: the numbers of spatial
    dimensions of the maps its formula is defined for (:data:`IMAGE_MAPS`, the default: 2-D only; :data:`ANY_RANK`),
    the table's ``grids``; a layer (or, for a method that reads none, an input) of another rank is refused before any
    work (:func:`gradcam_cli.cam.ranks.check_ranks`). ``fusion``: how its maps of several layers make one
    (:data:`~gradcam_cli.cam.maps.Fusion`: ``mean``, every method's but RefineCAM's ``product``); ``stages``: how
    many of the model's last stages it reads where it is given one layer or none and is the only method reading
    layers in the run (:meth:`Explainer <gradcam_cli.cam.explainer.Explainer>`; 1, the default: that layer alone)."""

    @overload
    def __init__(
        self: CamMethod[None],
        name: str,
        compute: LayerMap,
        *,
        needs: None = None,
        uses_gradients: bool = True,
        class_agnostic: bool = False,
        tasks: tuple[str, ...] = TASK_NAMES,
        uses_layer: bool = True,
        needs_target: bool = True,
        **row: Unpack[MethodRow],
    ) -> None: ...

    @overload
    def __init__(
        self,
        name: str,
        compute: LayerMapWith[E],
        *,
        needs: Need[E],
        uses_gradients: bool = True,
        class_agnostic: bool = False,
        tasks: tuple[str, ...] = TASK_NAMES,
        uses_layer: bool = True,
        needs_target: bool = True,
        **row: Unpack[MethodRow],
    ) -> None: ...

    def __init__(
        self,
        name: str,
        compute: LayerMap | LayerMapWith[E],
        *,
        needs: Need[E] | None = None,
        uses_gradients: bool = True,
        class_agnostic: bool = False,
        tasks: tuple[str, ...] = TASK_NAMES,
        uses_layer: bool = True,
        needs_target: bool = True,
        **row: Unpack[MethodRow],
    ) -> None:
        self.name = name
        self.compute: Callable[..., torch.Tensor] = compute
        self.needs = needs
        self.uses_gradients = uses_gradients
        self.class_agnostic = class_agnostic
        self.tasks = tasks
        self.uses_layer = uses_layer
        self.needs_target = needs_target
        self.formula, self.paper, self.cost = row.get("formula", ""), row.get("paper", ""), row.get("cost", "")
        self.ranks = row.get("ranks", IMAGE_MAPS)
        self.fusion: Fusion = row.get("fusion", "mean")
        self.stages = row.get("stages", 1)

    def __repr__(self) -> str:
        return f"CamMethod({self.name!r}, needs={self.needs!r})"

    @property
    def uses_model(self) -> bool:
        """Whether the method runs the model again on altered inputs or activations (Score-CAM, AblationCAM, RISE,
        occlusion)."""
        return self.needs is not None and self.needs.uses_model

    @property
    def reads_every_layer(self) -> bool:
        """Whether the method reads layers besides the explained ones (FullGrad: every bias and its gradient), so
        that folding batch norms into convolutions would change its maps."""
        return self.needs is not None and self.needs.reads_every_layer

    @property
    def shows_progress(self) -> bool:
        """Whether the command line shows a progress bar for the method's passes (Score-CAM's masked inputs,
        AblationCAM's ablated copies)."""
        return self.needs is not None and self.needs.shows_progress

    @property
    def keeps_graph(self) -> bool:
        """Whether the method differentiates the explained pass's graph again (ShapleyCAM, Finer-CAM), so that the
        backward pass to the layer must keep it."""
        return self.needs is not None and self.needs.keeps_graph


def register_method_plugin(name: str, loaded: object) -> None:
    """An entry point of ``gradcam_cli.methods``: a module registered its methods on import; a :class:`CamMethod`
    is registered under the entry point's name (which must be its own)."""
    if isinstance(loaded, CamMethod):
        if loaded.name != name:
            raise UsageError(f"the method plugin {name!r} names a method called {loaded.name!r}; name them alike")
        METHODS.register(name, loaded)
    elif not hasattr(loaded, "__path__") and not hasattr(loaded, "__file__"):
        raise UsageError(f"the method plugin {name!r} names a {type(loaded).__name__}, not a module or a CamMethod")


METHODS: Registry[CamMethod[Any]] = Registry("method", METHODS_GROUP, register_method_plugin)
"""Every method, by the name ``--method`` accepts: the package's own in docs/methods.md's order, then plugins' and
a notebook's."""


def register_method(method: CamMethod[Any], *, replace: bool = False) -> CamMethod[Any]:
    """Add ``method`` under its name (a notebook's, a plugin module's), for the library, the command line and
    ``gradcam serve`` alike; ``replace`` lets it take the place of a method of the same name."""
    return METHODS.register(method.name, method, replace=replace)


class MapError(ValueError):
    """A method returned something other than a map: NaN or infinite values, or not one map per sample with the
    layer's spatial rank (a method that reads no layer: the input's). Not a :class:`~gradcam_cli.errors.GradcamError`:
    it is the input's failure, so a batch goes on without it."""


def check_maps(
    maps: Mapping[str, Sequence[Sequence[torch.Tensor]]],
    activations: Mapping[str, torch.Tensor],
    layers: Sequence[str],
    inputs: torch.Tensor,
) -> None:
    """Each method's coarse maps, ``maps[method][k][l]`` (target k, layer ``layers[l]``), as every method's output
    passes once: a :class:`MapError` naming the method (and the layer) for a map that is not finite, or not of the
    batch and spatial rank of its layer's ``activations`` (N, C, *spatial) (a method that reads no layer: of
    ``inputs``)."""
    for name, per_target in maps.items():
        method = METHODS[name]
        for computed in per_target:
            for layer, cam in zip(layers if method.uses_layer else [None], computed, strict=False):
                _check_map(name, layer, cam, inputs if layer is None else activations.get(layer))


def _check_map(name: str, layer: str | None, cam: torch.Tensor, reference: torch.Tensor | None) -> None:
    """Only the batch and the spatial rank are held: maps come at the layer's resolution, a lower one (KPCA-CAM) or
    the input's (FullGrad, the guided methods)."""
    where = f" at layer {layer}" if layer is not None else ""
    if reference is not None and (cam.dim() != reference.dim() - 1 or cam.shape[0] != reference.shape[0]):
        rank = reference.dim() - 2
        expected = " x ".join([str(reference.shape[0]), *(["d", "h", "w"][3 - rank :] if rank <= 3 else ["..."])])
        shape = " x ".join(map(str, cam.shape)) or "scalar"
        raise MapError(f"--method {name} returned a {shape} tensor{where}, not a map of {expected}")
    if not bool(torch.isfinite(cam).all()):
        kind = "NaN" if bool(torch.isnan(cam).any()) else "infinite"
        raise MapError(f"--method {name} returned {kind} values{where}, not a map")


def stages_of(methods: Collection[str]) -> int:
    """How many of the model's last stages ``methods`` read from one layer: the :attr:`CamMethod.stages` of those
    reading layers where they all say the same (RefineCAM's 4 where it is alone), else 1 (that layer alone)."""
    stages = {METHODS[name].stages for name in methods if METHODS[name].uses_layer}
    return stages.pop() if len(stages) == 1 else 1


def resolve_methods(names: Sequence[str], task: str, also: Collection[str] = (), noun: str | None = None) -> list[str]:
    """``names`` checked against :data:`METHODS` and ``task`` (a one-line :class:`UsageError` for a name that is
    not a method or a method that does not serve the task); ``all`` (:data:`~gradcam_cli.options.ALL_METHODS`)
    stands for every method that serves the task, in registry order. ``also``: methods that serve this model
    although not its task (a YOLO detector's AblationCAM, a vision-language answer's); ``noun``: what the model is
    called in that message (default: the built-in task's noun)."""
    for name in names:
        if name not in METHODS and name != ALL_METHODS:
            raise UsageError(f"unknown method {name!r}.{suggest(name, METHODS.names())}")
    if ALL_METHODS in names:
        names = [name for name, method in METHODS.items() if task in method.tasks or name in also]
    for name in names:
        if task not in METHODS[name].tasks and name not in also:
            kinds = " and ".join(f"{NOUNS[kind]}s" for kind in METHODS[name].tasks)
            taken = ", ".join(other for other, method in METHODS.items() if task in method.tasks or other in also)
            raise UsageError(f"--method {name} is for {kinds}; a {noun or NOUNS.get(task, task)} takes {taken}")
    return list(names)
