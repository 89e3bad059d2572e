"""How every dlguard probe, generator and sampler calls a model (SPEC §0, model contract)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from dlguard._validation import check_logits, optional_positive_int, positive_int
from dlguard.probes.budget import default_max_batch
from dlguard.probes.evaluation import model_device

__all__ = ["ModelAdapter"]

_OUTPUT_HINT = "; pass output_transform= to map the model's output to logits (B, K)"


def model_dtype(model: nn.Module) -> torch.dtype:
    """The floating dtype of the model's first floating parameter or buffer (float32 when it has none)."""
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


class ModelAdapter:
    """A model as the probes see it: ``output_transform(model(preprocess(x)))`` on the model's device and dtype.

    Perturbations, radii and severities live in pixel space (SPEC §0); ``preprocess`` (e.g.
    torchvision's ``Normalize``) maps perturbed pixels to what the model expects, ``output_transform``
    maps what it returns (a dict, a tuple, detection records) to a tensor. Floating inputs are cast to
    the model's dtype (``precision="64-true"`` trains a float64 model on float32 data) and moved to
    its device; half-precision logits are returned as float32 so counts and softmax stay exact.
    The adapter never changes the model's mode: run it under :func:`~dlguard.probes.evaluation`.

    Args:
        model: any ``nn.Module`` (usually the ``LightningModule``).
        preprocess: applied to inputs after any perturbation, before the model.
        output_transform: applied to the model's output.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Linear(2, 3).double()
        >>> adapter = ModelAdapter(net, preprocess=lambda x: 2 * x - 1, output_transform=lambda out: out[:, :2])
        >>> adapter.logits(torch.zeros(4, 2)).shape, adapter.dtype
        (torch.Size([4, 2]), torch.float64)
    """

    def __init__(
        self,
        model: nn.Module,
        preprocess: Callable[[Tensor], Tensor] | None = None,
        output_transform: Callable[[Any], Tensor] | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ValueError(f"model: expected an nn.Module, got {type(model).__name__}")
        for name, value in (("preprocess", preprocess), ("output_transform", output_transform)):
            if value is not None and not callable(value):
                raise ValueError(f"{name}: expected a callable or None, got {type(value).__name__}")
        self.model, self.preprocess, self.output_transform = model, preprocess, output_transform

    @classmethod
    def wrap(
        cls,
        model: nn.Module | ModelAdapter,
        preprocess: Callable[[Tensor], Tensor] | None = None,
        output_transform: Callable[[Any], Tensor] | None = None,
    ) -> ModelAdapter:
        """``model`` itself when it is an adapter, else an adapter around it with ``preprocess``/``output_transform``.

        Every generator and probe takes ``model: nn.Module | ModelAdapter`` through this one door.

        Raises:
            ValueError: for ``preprocess`` or ``output_transform`` given beside an adapter (they belong in it).
        """
        if not isinstance(model, ModelAdapter):
            return cls(model, preprocess, output_transform)
        if preprocess is not None or output_transform is not None:
            raise ValueError("preprocess, output_transform: give them to the ModelAdapter, not beside it")
        return model

    @property
    def device(self) -> torch.device:
        """The model's device."""
        return model_device(self.model)

    @property
    def dtype(self) -> torch.dtype:
        """The model's floating dtype."""
        return model_dtype(self.model)

    def prepare(self, inputs: Tensor) -> Tensor:
        """``preprocess(inputs)`` on the model's device and, for floating inputs, in its dtype."""
        device, dtype = self.device, self.dtype
        inputs = inputs.to(device=device, dtype=dtype if inputs.is_floating_point() else inputs.dtype)
        if self.preprocess is None:
            return inputs
        if isinstance(self.preprocess, nn.Module) and model_device(self.preprocess) != device:
            self.preprocess.to(device)  # a Normalize with buffers follows the model, as Lightning moves metrics
        prepared = self.preprocess(inputs)
        # float32 statistics (mean, std) promote half-precision inputs back to float32: the model gets its dtype
        if isinstance(prepared, Tensor) and prepared.is_floating_point() and prepared.dtype != dtype:
            prepared = prepared.to(dtype)
        return prepared

    def finish(self, output: Any) -> Tensor:
        """``output_transform(output)``; half-precision results come back as float32."""
        result = self.output_transform(output) if self.output_transform is not None else output
        if isinstance(result, Tensor) and result.dtype in (torch.float16, torch.bfloat16):
            result = result.float()
        return result

    def __call__(self, inputs: Tensor) -> Tensor:
        """The model's (transformed) output on ``inputs`` in pixel space."""
        return self.finish(self.model(self.prepare(inputs)))

    def rows_per_pass(self, inputs: Tensor, max_batch: int | None = None) -> int:
        """``max_batch`` when given, else the rows whose largest layer output fits a memory budget.

        The one meaning of ``max_batch=None`` in every dlguard generator and callback:
        :func:`~dlguard.probes.default_max_batch` of the prepared inputs (8 MiB of the largest layer
        output on CPU, 2 GiB on CUDA), measured with one input (run it under
        :func:`~dlguard.probes.evaluation`).
        """
        if max_batch is not None:
            return positive_int("max_batch", max_batch)
        with torch.no_grad():
            return default_max_batch(self.model, self.prepare(inputs[:1]))

    def logits(self, inputs: Tensor, max_batch: int | None = None, num_classes: int | None = None) -> Tensor:
        """Logits ``(B, K)`` in passes of at most ``max_batch`` inputs, checked for shape.

        Raises:
            ValueError: naming ``output_transform`` when the model's output is not ``(B, K)``, or
                ``num_classes`` when ``K`` differs from it.
        """
        optional_positive_int("max_batch", max_batch)
        parts = [inputs] if max_batch is None or len(inputs) <= max_batch else list(inputs.split(max_batch))
        outputs = []
        for part in parts:
            out = self(part)
            outputs.append(check_logits("model", out, len(part), num_classes, _OUTPUT_HINT))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)
