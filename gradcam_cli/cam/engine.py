"""The hook engine: the one place that touches a model's hooks (its modes and gradient flags: under
:func:`~gradcam_cli.models.modes.model_state_preserved`, for every pass).

A forward hook on each target layer records its feature maps and hands the rest of the network a fresh leaf
tensor in their place, so the backward pass starts at the class score and stops at the target layer: nothing
before it is differentiated, and no parameter ``.grad`` is ever written. Gradients come from a full backward hook
(``register_full_backward_hook``) on the layer.

The in-place trap: a full backward hook wraps the layer's output in a view made by ``BackwardHookFunction``; an
in-place op after the layer (``ReLU(inplace=True)`` after a VGG conv, ``F.relu(x, inplace=True)`` after DenseNet's
``features``, ``out += identity`` after a ResNet block's last BatchNorm) then raises "Output 0 of
BackwardHookFunction is a view and is being modified inplace". The engine catches that error, remembers the module,
and reruns the forward in *tensor-hook mode*: the forward hook returns a clone of the leaf, so the in-place op
edits the clone, and a tensor hook on the leaf receives the gradient. Either way the recorded activations are the
layer's own output, taken before any later in-place op could change them.

A module that runs more than once per forward (ResNet blocks reuse one ``ReLU`` three times) is explained at its
*last* call: each call gets its own leaf, and only the last call's leaf is differentiated.

Some methods need more passes, all made here or under :func:`model_state_preserved`: Score-CAM's masked inputs and
AblationCAM's ablated activations (:meth:`LayerCapture.forward_output_unhooked`,
:meth:`LayerCapture.forward_output_replaced`: no autograd, the capture's hooks removed first), FullGrad's pass
from the input through every bias layer (:meth:`LayerCapture.full_gradients`, a capture of its own whose inputs
require gradients, so that nothing is cut off), and guided backpropagation (:mod:`gradcam_cli.cam.guided`: no hook
at all, a function mode that changes the ReLUs' backward rule while it is active).

Attention (:meth:`LayerCapture.watch_attention`): the explained pass records each self-attention module's
probabilities (N, heads, L, L), the tensors the values are multiplied with, on a copy of the input that requires
gradients (so every layer's are in the graph); each module takes its plain path for that pass only, put back as
found after it, also when it raises (:mod:`gradcam_cli.cam.attention.discovery`, by family).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from ..errors import UsageError
from ..models.modes import model_state_preserved
from .attention.discovery import HF, TIMM, AttentionModel, AttentionSite
from .logits import as_logits

_INPLACE_ERROR_MARKERS = ("BackwardHookFunction", "inplace")

_HOOK_FIRING = "Full backward hook is firing when gradients are computed with respect to module outputs"
# The engine's full backward hooks fire "with respect to module outputs since no inputs require gradients" by
# design (the graph starts at the layer), which PyTorch warns of at every backward pass. The filter is also set once
# for the process: warnings.catch_warnings() is not thread-safe, and a decoding thread's own catch_warnings() can
# restore the filters without the pass's filter while the pass runs.
warnings.filterwarnings("ignore", message=_HOOK_FIRING)
_modules_needing_tensor_hooks: weakref.WeakSet[nn.Module] = weakref.WeakSet()


@dataclass
class LayerRecord:
    """What the hooks saw of one target layer during the last forward and backward pass."""

    name: str
    module: nn.Module
    calls: int = 0
    activations: torch.Tensor | None = None
    gradients: torch.Tensor | None = None
    leaf: torch.Tensor | None = None
    handles: list[torch.utils.hooks.RemovableHandle] = field(default_factory=list)


@dataclass
class AttentionRecord:
    """An attention module's probabilities (N, heads, L, L) at its last call; ``consumed``: what V was multiplied by."""

    site: AttentionSite
    probabilities: torch.Tensor | None = None
    consumed: torch.Tensor | None = None


KeptLayers = dict[str, tuple[torch.Tensor | None, torch.Tensor | None, int]]  # activations, leaf, calls per layer


class LayerCapture:
    """Context manager that hooks target layers, runs forward passes and returns their gradients.

    >>> with LayerCapture(model, {"layer4": model.layer4}) as capture:
    ...     logits = capture.forward(batch)
    ...     grads = capture.gradients(logits[:, 281].sum())
    ...     acts = capture.activations()
    """

    def __init__(self, model: nn.Module, layers: Mapping[str, nn.Module], tensor_hooks: bool = False) -> None:
        """``tensor_hooks``: start in tensor-hook mode for every layer (FullGrad hooks every BatchNorm, most of
        them followed by an in-place ReLU). Without layers it hooks nothing: the passes of methods that read no
        layer (RISE, occlusion) still get the model's state handled here."""
        self.model = model
        self.tensor_hooks = tensor_hooks
        self.records = {name: LayerRecord(name, module) for name, module in layers.items()}
        self.attention: list[AttentionRecord] = []
        self.watched: AttentionModel | None = None
        self.skipped: Sequence[nn.Module] = ()
        self._exit_stack = ExitStack()

    def __enter__(self) -> LayerCapture:
        self._exit_stack.enter_context(model_state_preserved(self.model))
        self._exit_stack.callback(self._release)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._exit_stack.close()

    def _release(self) -> None:
        self.remove_hooks()
        for record in self.records.values():
            record.activations = record.gradients = record.leaf = None
        self.attention = []

    def watch_attention(self, model: AttentionModel | None, skipped: Sequence[nn.Module] = ()) -> None:
        """Record the probabilities of ``model``'s attention (``watched``) during the next :meth:`forward_output`,
        in which each of ``skipped`` passes its input on unchanged."""
        self.watched, self.attention = model, [AttentionRecord(site) for site in (model.sites if model else ())]
        self.skipped = skipped

    def attention_maps(self) -> list[torch.Tensor]:
        """Each watched module's probabilities (N, heads, L, L) from the explained pass, first layer first."""
        missing = [record.site.name for record in self.attention if record.probabilities is None]
        if missing:
            raise UsageError(f"attention module {missing[0]!r} did not run during the forward pass")
        return [record.probabilities.detach() for record in self.attention if record.probabilities is not None]

    def attention_gradients(self, score: torch.Tensor, retain_graph: bool = False) -> list[torch.Tensor]:
        """The gradient of a scalar ``score`` with respect to each watched module's probabilities (N, heads, L, L)."""
        maps = self.attention_maps()  # every module ran
        consumed = [record.consumed for record in self.attention if record.consumed is not None]
        grads = torch.autograd.grad(score, consumed, retain_graph=retain_graph, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g.reshape(p.shape) for g, p in zip(grads, maps, strict=True)]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Run the model with hooks in place and return its logits (graph kept from the target layers on)."""
        return as_logits(self.forward_output(inputs))

    def forward_output(self, inputs: torch.Tensor) -> object:
        """:meth:`forward`, returning whatever the model returns (a detector's list of dicts, a segmenter's dict)."""
        try:
            return self._forward_once(inputs)
        except RuntimeError as error:
            if not all(marker in str(error) for marker in _INPLACE_ERROR_MARKERS):
                raise
            _modules_needing_tensor_hooks.update(r.module for r in self.records.values())
            return self._forward_once(inputs)

    def kept(self) -> KeptLayers:
        """What this capture's forward pass left at each layer, for :meth:`replay` in another capture."""
        return {name: (r.activations, r.leaf, r.calls) for name, r in self.records.items()}

    def replay(self, kept: KeptLayers) -> None:
        """Restore a pass's layers (:meth:`kept`), as if this capture had run it: no forward pass (its graph kept)."""
        for name, record in self.records.items():
            record.activations, record.leaf, record.calls = kept[name]

    def gradients(self, score: torch.Tensor, retain_graph: bool = False) -> dict[str, torch.Tensor]:
        """Backpropagate a scalar ``score`` to the target layers; return each layer's output gradient."""
        missing = [r.name for r in self.records.values() if r.leaf is None]
        if missing:
            raise UsageError(f"layer {missing[0]!r} did not run during the forward pass; choose another --layer")
        return self._differentiate(score, list(self.records.values()), (), retain_graph)[0]

    def full_gradients(
        self, score: torch.Tensor, inputs: torch.Tensor, retain_graph: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """FullGrad's backward pass: the gradient of ``score`` with respect to ``inputs`` (the tensor, requiring
        gradients, that :meth:`forward_output` was given) and to the output of every layer that ran."""
        ran = [record for record in self.records.values() if record.leaf is not None]
        grads, (input_gradient,) = self._differentiate(score, ran, (inputs,), retain_graph)
        return input_gradient, grads

    def _differentiate(
        self, score: torch.Tensor, records: list[LayerRecord], extra: Sequence[torch.Tensor], retain_graph: bool
    ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        leaves = [record.leaf for record in records if record.leaf is not None]
        for record in records:
            record.gradients = None
        with warnings.catch_warnings():  # quiet also where the process's filters show every warning
            warnings.filterwarnings("ignore", message=_HOOK_FIRING)
            direct = torch.autograd.grad(score, [*leaves, *extra], retain_graph=retain_graph, allow_unused=True)
        grads = {}
        for record, leaf, fallback in zip(records, leaves, direct, strict=False):
            grad = record.gradients if record.gradients is not None else fallback
            grads[record.name] = torch.zeros_like(leaf) if grad is None else grad
        extras = [torch.zeros_like(t) if g is None else g for t, g in zip(extra, direct[len(leaves) :], strict=True)]
        return grads, extras

    def hessian_vector_products(self, score: torch.Tensor) -> dict[str, torch.Tensor]:
        """ShapleyCAM's second-order term: for each target layer, H A, the Hessian of ``score`` with respect to the
        layer's output A times A itself, as the gradient of <dS/dA, A> with A held fixed (a second backward pass
        through the first one, ``create_graph``). Zeros where the gradient does not depend on A (everything after
        the layer piecewise linear). The graph is kept for the other targets and methods."""
        records = [record for record in self.records.values() if record.leaf is not None]
        leaves = [record.leaf for record in records if record.leaf is not None]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_HOOK_FIRING)
            first = torch.autograd.grad(score, leaves, retain_graph=True, create_graph=True, allow_unused=True)
            products = {}
            for record, leaf, gradient in zip(records, leaves, first, strict=True):
                product = None
                if gradient is not None and gradient.requires_grad:
                    (product,) = torch.autograd.grad(
                        gradient, leaf, grad_outputs=leaf.detach(), retain_graph=True, allow_unused=True
                    )
                products[record.name] = torch.zeros_like(leaf) if product is None else product.detach()
        return products

    def forward_unhooked(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits of an extra forward pass with the hooks removed and autograd off (Score-CAM's masked inputs).

        Recorded activations, leaves and graph from the last :meth:`forward` stay usable for :meth:`gradients`.
        """
        return as_logits(self.forward_output_unhooked(inputs))

    def forward_output_unhooked(self, inputs: torch.Tensor) -> object:
        """:meth:`forward_unhooked`, returning whatever the model returns."""
        self.remove_hooks()
        with torch.no_grad():
            output: object = self.model(inputs)
        return output

    def forward_output_replaced(self, inputs: torch.Tensor, name: str, replacement: torch.Tensor) -> object:
        """:meth:`forward_output_unhooked` in which layer ``name``, at the call :meth:`forward` explained (its
        last), outputs ``replacement`` instead of its own output (AblationCAM's ablated activations)."""
        record = self.records[name]
        self.remove_hooks()
        calls = 0

        def replace(_module: nn.Module, _inputs: object, output: object) -> object:
            nonlocal calls
            calls += 1
            return replacement if calls == record.calls else output

        handle = record.module.register_forward_hook(replace, prepend=True)
        try:
            with torch.no_grad():
                output: object = self.model(inputs)
        finally:
            handle.remove()
        return output

    def activations(self) -> dict[str, torch.Tensor]:
        """Feature maps of each target layer's last call, as the layer produced them."""
        missing = [name for name, record in self.records.items() if record.activations is None]
        if missing:
            raise UsageError(f"layer {missing[0]!r} did not run during the forward pass; choose another --layer")
        return {name: record.activations for name, record in self.records.items() if record.activations is not None}

    def calls(self) -> dict[str, int]:
        """How often each target layer ran during the last forward pass."""
        return {name: record.calls for name, record in self.records.items()}

    def _forward_once(self, inputs: torch.Tensor) -> object:
        self.remove_hooks()
        for record in self.records.values():
            record.calls = 0
            record.activations = record.gradients = record.leaf = None
            self._register(record, tensor_mode=self.tensor_hooks or record.module in _modules_needing_tensor_hooks)
        with torch.enable_grad(), self._attention_pass():
            if self.attention:  # every layer's probabilities in the graph, the first layer's too
                inputs = inputs.detach().requires_grad_(True)
            output: object = self.model(inputs)
        return output

    @contextmanager
    def _attention_pass(self) -> Iterator[None]:
        with ExitStack() as stack:  # the watched modules on their plain path, recording
            for record in self.attention:
                record.probabilities = record.consumed = None
                _plain_attention(record, stack)
            for module in self.skipped:  # LeGrad's intermediate layers: the blocks after them skipped
                stack.callback(module.register_forward_hook(_input_on, with_kwargs=True).remove)
            yield

    def _register(self, record: LayerRecord, tensor_mode: bool) -> None:
        def save_gradient(grad: torch.Tensor) -> None:
            record.gradients = grad

        def on_forward(_module: nn.Module, _inputs: object, output: object) -> torch.Tensor:
            if not isinstance(output, torch.Tensor):
                raise UsageError(
                    f"layer {record.name!r} outputs {type(output).__name__}, not a tensor; choose another --layer"
                )
            record.calls += 1
            record.activations = output.detach()
            # The first target layer starts the graph with a fresh leaf; a target layer downstream of it keeps its
            # output connected, so that gradients still reach the earlier one (--layer layer3 --layer layer4).
            record.leaf = output if output.requires_grad else output.detach().requires_grad_(True)
            if tensor_mode:
                record.leaf.register_hook(save_gradient)  # type: ignore[no-untyped-call]
                return record.leaf.clone()
            return standard_layout(record.leaf)

        def on_backward(_module: nn.Module, _grad_input: object, grad_output: Sequence[torch.Tensor]) -> None:
            record.gradients = grad_output[0]

        # First among the layer's forward hooks: hooks installed before (transformers' recorders of hidden states,
        # installed for good on a model's first pass, ``generate``'s included) then see the leaf, not the original.
        record.handles.append(record.module.register_forward_hook(on_forward, prepend=True))
        if not tensor_mode:
            record.handles.append(record.module.register_full_backward_hook(on_backward))

    def remove_hooks(self) -> None:
        """Remove the hooks; what the last :meth:`forward` recorded (its graph included) stays usable."""
        for record in self.records.values():
            for handle in record.handles:
                handle.remove()
            record.handles.clear()


def _record(record: AttentionRecord, probabilities: object, consumed: object = None) -> None:
    if not isinstance(probabilities, torch.Tensor) or probabilities.dim() != 4:
        raise UsageError(f"attention module {record.site.name!r} gave no attention probabilities")
    record.probabilities = probabilities
    record.consumed = consumed if isinstance(consumed, torch.Tensor) else probabilities


def _plain_attention(record: AttentionRecord, stack: ExitStack) -> None:
    """One attention module on its plain path, its probabilities recorded, until ``stack`` closes (by kind: see
    :mod:`gradcam_cli.cam.attention.discovery`)."""
    module, switches = record.site.module, cast(Any, record.site.module)  # attributes mypy does not know
    if record.site.kind == TIMM:
        stack.callback(setattr, module, "fused_attn", switches.fused_attn)
        switches.fused_attn = False
        hook = module.get_submodule("attn_drop").register_forward_hook(lambda _m, _i, out: _record(record, out))
    elif record.site.kind == HF:
        stack.callback(setattr, switches.config, "_attn_implementation", switches.config._attn_implementation)
        switches.config._attn_implementation = "eager"
        hook = module.register_forward_hook(lambda _m, _i, out: _record(record, out[1]))
    else:  # MHA: the weights are a view (N, heads, L, L) of the (N * heads, L, L) probabilities the values met
        stack.callback(module.register_forward_pre_hook(_weights_wanted, with_kwargs=True).remove)
        hook = module.register_forward_hook(lambda _m, _i, out: _record(record, out[1], out[1]._base))
    stack.callback(hook.remove)


def _weights_wanted(_module: nn.Module, args: Any, kwargs: Any) -> Any:
    return args, {**kwargs, "need_weights": True, "average_attn_weights": False}  # the explicit softmax path


def _input_on(_module: nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
    """A skipped block's output: its input (in the place of the first element where the output is a tuple)."""
    hidden = args[0] if args else next(iter(kwargs.values()))
    return hidden if isinstance(output, torch.Tensor) else (hidden, *output[1:])


def standard_layout(output: torch.Tensor) -> torch.Tensor:
    """What the network gets in place of a layer's output under a full backward hook: ``output`` itself, or a copy
    in the standard (contiguous) memory layout where it is in another one, channels-last say.

    PyTorch's full backward hook hands the network ``output.view_as(output)``, and a view recomputes the stride of
    every size-1 dimension. A channels-last batch of one image (1, C, H, W) thus reaches the next op with batch
    stride C instead of C*H*W: still channels-last contiguous, but no longer channels-last by PyTorch's stride
    heuristic, and CPU batch norm's backward, which checks the layout one way and dispatches on it the other, then
    reads the incoming gradient in the wrong layout: wrong gradients, no error (PyTorch 2.15; ``aten``'s
    ``native_batch_norm_backward`` given ``x.view(x.shape)`` of such an ``x`` shows it alone). A contiguous copy has
    the same values and keeps its strides through the view. Batches of every size get it, so that what runs after
    the layer, and how it rounds, never depends on how many images share a batch (a shard's maps equal a whole
    run's).
    """
    return output if output.is_contiguous() else output.contiguous()
