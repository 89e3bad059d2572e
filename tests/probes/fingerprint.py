"""Everything SPEC §0 says a probe must leave exactly as it found it."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


def fingerprint(model: nn.Module) -> dict[str, Any]:
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "training": {name: m.training for name, m in model.named_modules()},
        "requires_grad": {name: p.requires_grad for name, p in model.named_parameters()},
        "hooks": {
            name: {attr: list(getattr(m, attr, {}).items()) for attr in _HOOK_DICTS}
            for name, m in model.named_modules()
        },
    }


def assert_unchanged(model: nn.Module, before: dict[str, Any]) -> None:
    after = fingerprint(model)
    assert after["state"].keys() == before["state"].keys()
    for key, value in before["state"].items():
        assert torch.equal(after["state"][key], value), f"state_dict[{key!r}] changed"
    assert after["training"] == before["training"]
    assert after["requires_grad"] == before["requires_grad"]
    assert after["hooks"] == before["hooks"]
