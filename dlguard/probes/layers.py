"""Choosing the layers a probe looks at."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

from torch import nn

__all__ = ["LayerSpec", "resolve_layers", "select_layers"]

LayerSpec = str | Iterable[str] | Mapping[str, nn.Module]
"""A layer name, several names, or a ``{name: module}`` mapping as :func:`select_layers` returns."""


def _describe(model: nn.Module) -> str:
    names = [f"{name} ({type(module).__name__})" for name, module in model.named_modules() if name]
    return ", ".join(names) if names else "none (the model has no submodules)"


def select_layers(
    model: nn.Module,
    types: type[nn.Module] | tuple[type[nn.Module], ...] | None = None,
    names: str | Iterable[str] | None = None,
) -> dict[str, nn.Module]:
    """Select named layers of ``model`` by type and/or name.

    Args:
        model: the network to look into.
        types: keep only layers that are instances of these types.
        names: keep only layers whose qualified name matches one of these names or shell-style
            patterns (``"features.*"``).
            With neither ``types`` nor ``names``, every leaf layer is selected.

    Returns:
        ``{qualified name: layer}`` in the model's registration order.

    Raises:
        ValueError: if nothing matches; the message lists the layers the model has.

    Example:
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))
        >>> list(select_layers(net, types=nn.Conv2d))
        ['0']
        >>> list(select_layers(net, names=["1", "3"]))
        ['1', '3']
    """
    patterns = [names] if isinstance(names, str) else None if names is None else list(names)
    selected: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        if not name:
            continue
        if types is not None and not isinstance(module, types):
            continue
        if patterns is not None and not any(fnmatchcase(name, p) for p in patterns):
            continue
        if types is None and patterns is None and next(module.children(), None) is not None:
            continue
        selected[name] = module
    if not selected:
        wanted = []
        if types is not None:
            type_tuple = types if isinstance(types, tuple) else (types,)
            wanted.append("of type " + " or ".join(t.__name__ for t in type_tuple))
        if patterns is not None:
            wanted.append(f"named {patterns}")
        raise ValueError(
            f"select_layers found no layer {' and '.join(wanted) or 'at all'} in "
            f"{type(model).__name__}; available layers: {_describe(model)}"
        )
    return selected


def resolve_layers(model: nn.Module, layers: LayerSpec) -> dict[str, nn.Module]:
    """Turn a :data:`LayerSpec` into ``{name: module}``, checking every layer belongs to ``model``.

    Raises:
        ValueError: for an empty selection, an unknown name (the message lists the available
            layers) or a module that is not the model's layer of that name.
    """
    available = dict(model.named_modules())
    if isinstance(layers, Mapping):
        resolved = dict(layers)
        for name, module in resolved.items():
            if available.get(name) is not module:
                raise ValueError(
                    f"layers: {name!r} is not a layer of {type(model).__name__} (or names another "
                    f"module); available layers: {_describe(model)}"
                )
    else:
        wanted = [layers] if isinstance(layers, str) else list(layers)
        unknown = [name for name in wanted if name not in available or not name]
        if unknown:
            raise ValueError(
                f"layers: {unknown} not found in {type(model).__name__}; available layers: {_describe(model)}"
            )
        resolved = {name: available[name] for name in wanted}
    if not resolved:
        raise ValueError("layers: the selection is empty; name at least one layer")
    return resolved
