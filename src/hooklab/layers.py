"""Pick layers by name, with errors that say what names exist.

Introduced in notebook 02 (with `hooklab.record`); every recorder and explorer of the course uses it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from torch import nn

from .checks import short

__all__ = ["UnknownLayerError", "get_layer", "layer_names", "leaf_names", "select_layers"]


def _close_matches(name: str, names: list[str]) -> list[str]:
    return difflib.get_close_matches(name, names, n=5, cutoff=0.5)


def unknown_name_hint(name: str, names: list[str], kind: str = "layers") -> str:
    """How an error about an unknown ``name`` ends: ``close matches: 'a', 'b'`` (up to five of
    ``names``), or, when none is close, ``its <kind> are 'x', 'y', ... and N more`` (the first eight).

    Every lookup by name in hooklab ends its error with this (layers, parameters, explorer labels).
    """
    return _hint(_close_matches(name, names), names, kind)


def _hint(candidates: list[str], names: list[str], kind: str) -> str:
    if candidates:
        return "close matches: " + ", ".join(repr(c) for c in candidates)
    shown = ", ".join(repr(n) for n in names[:8])
    more = f" and {len(names) - 8} more" if len(names) > 8 else ""
    return f"its {kind} are {shown}{more}"


class UnknownLayerError(LookupError):
    """Raised for a layer name that the model does not have; lists the close matches."""

    def __init__(self, name: str, model: nn.Module, names: list[str]):
        self.name = name
        self.candidates = _close_matches(name, names)
        hint = _hint(self.candidates, names, "layers")
        super().__init__(f"{type(model).__name__} has no layer named {name!r}; {hint}")

    def __str__(self) -> str:  # LookupError would print the message with quotes around it
        return self.args[0]


def layer_names(model: nn.Module) -> list[str]:
    """Every submodule name in ``named_modules()`` order (the root is ``""``)."""
    return [name for name, _ in model.named_modules()]


def leaf_names(model: nn.Module) -> list[str]:
    """Names of the modules that have no children: the layers that do the work."""
    return [name for name, m in model.named_modules() if _is_leaf(m)]


def _check_name(name: object, model: nn.Module | None = None) -> None:
    if isinstance(name, nn.Module):
        raise TypeError(_module_given(name, model))
    if not isinstance(name, str):
        hint = f"; did you mean {str(name)!r}?" if isinstance(name, int) and not isinstance(name, bool) else ""
        if hasattr(name, "shape"):
            hint = "; are those your images? check the order of the arguments"
        got = f"{short(name)} ({type(name).__name__})"
        raise TypeError(f"layer names are strings such as 'features.0', not {got}{hint}")


def _module_given(module: nn.Module, model: nn.Module | None) -> str:
    """What to say when a module was passed where its name belongs."""
    name = next((n for n, m in model.named_modules() if m is module), None) if model is not None else None
    kind = type(module).__name__
    if name is None:
        where = f" of {type(model).__name__}" if model is not None else ""
        return (f"layers are chosen by name (strings such as 'features.0'), not by module: you passed a {kind} "
                f"that is not a submodule{where}")
    if name == "":
        return (f"layers are chosen by name, not by module: you passed the model itself ({kind}); "
                "leave layers out to record every leaf layer")
    child = next((c for c, _ in module.named_children()), None)
    inside = "" if child is None else f" (or the names of the layers inside it, such as '{name}.{child}')"
    return (f"layers are chosen by name, not by module: you passed the {kind} {name!r} itself; "
            f"pass its name, {name!r}{inside}")


def get_layer(model: nn.Module, name: str) -> nn.Module:
    """``model.get_submodule(name)`` with an error listing close matches for a wrong name."""
    _check_name(name, model)
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise UnknownLayerError(name, model, [n for n in layer_names(model) if n]) from None


def select_layers(
    model: nn.Module,
    layers: Iterable[str] | str | None = None,
    types: type | tuple[type, ...] | None = None,
) -> dict[str, nn.Module]:
    """Choose modules: by names, by type, or (neither given) every leaf module.

    Returns ``{name: module}`` in ``named_modules()`` order for types and leaves, and in the
    given order for names. A choice that selects nothing raises ``ValueError`` saying why.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
    if types is not None:
        kinds = types if isinstance(types, tuple) else (types,)
        if not kinds or not all(isinstance(k, type) and issubclass(k, nn.Module) for k in kinds):
            raise TypeError(f"types must be module classes such as nn.Linear (or a tuple of them), not {short(types)}")
    if isinstance(layers, nn.Module):  # iterable (a Sequential), but meant as one layer
        raise TypeError(_module_given(layers, model))
    if isinstance(layers, str):
        layers = [layers]
    if layers is not None:
        if not isinstance(layers, Iterable) or hasattr(layers, "shape"):  # one tensor: not a list of names
            _check_name(layers, model)
        layers = list(layers)
        for name in layers:
            _check_name(name, model)
        if not layers:
            raise ValueError("no layer names given: pass some names, or layers=None for every leaf module")
        chosen = {name: get_layer(model, name) for name in layers}
        if types is not None:
            dropped = {n: m for n, m in chosen.items() if not isinstance(m, types)}
            if dropped:
                name, module = next(iter(dropped.items()))
                raise ValueError(f"{name!r} is a {type(module).__name__}, not one of types={_type_names(types)}")
        return chosen
    if types is not None:
        chosen = {n: m for n, m in model.named_modules() if isinstance(m, types)}
        if not chosen:
            present = sorted({type(m).__name__ for m in model.modules()})
            raise ValueError(f"types={_type_names(types)} matches no module of {type(model).__name__}; "
                             f"its module types are {', '.join(present)}")
        return chosen
    return {n: m for n, m in model.named_modules() if _is_leaf(m)}


def _type_names(types: type | tuple[type, ...]) -> str:
    kinds = types if isinstance(types, tuple) else (types,)
    return ", ".join(k.__name__ for k in kinds)


def _is_leaf(module: nn.Module) -> bool:
    return next(module.children(), None) is None
