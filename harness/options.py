"""Every option the user sets, checked against what the code declares, before anything is built.

``harness.config.check_options`` applies them to a composed config:

Hydra composes whatever the command line says: ``+method.selection.sinkz=4`` reaches the
constructor as an unknown keyword (a traceback), ``+rhoo=0.5`` is kept silently, and
``task.chat_template=maybe`` is a truthy string. Each check names the option as the user writes
it and the fix:

- ``check_appended``: a ``+key=value`` on the command line must name an option some part of
  the config reads (a top-level option, a config group, or a field of an instantiated node);
- ``check_fields``: every key of a node with a ``_target_`` must be a parameter of that class;
- ``check_types``: every field of a built dataclass (task, method and their parts) holds a
  value of its annotated type when that type is a plain scalar (bool, int, float, str, or an
  optional or union of them); a float must be finite.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig

#: Keys Hydra reads itself on an instantiated node.
_HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_"})


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {close[0]}? " if close else ""


def parameters(target: str) -> set[str] | None:
    """The keyword parameters of ``target``'s constructor, or None when it takes any keyword."""
    try:
        cls = get_class(target)
    except Exception:
        return None  # Hydra's own instantiate reports a target it cannot import
    if dataclasses.is_dataclass(cls):
        return {field.name for field in dataclasses.fields(cls) if field.init}
    signature = inspect.signature(cls)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        return None
    return set(signature.parameters)


def check_fields(node: Any, prefix: str) -> None:
    """Refuse a key of ``node`` (and of the nodes inside it) that its ``_target_`` class does not take."""
    if isinstance(node, ListConfig):
        for index, item in enumerate(node):
            check_fields(item, f"{prefix}[{index}]")
        return
    if not isinstance(node, DictConfig):
        return
    target = node.get("_target_") if "_target_" in node else None
    accepted = parameters(target) if isinstance(target, str) else None
    for key in node:
        key = str(key)
        if accepted is not None and key not in _HYDRA_KEYS and key not in accepted:
            raise ValueError(
                f"{prefix}.{key} is not an option of {target.rsplit('.', 1)[-1]} — {_suggest(key, accepted)}"
                f"its options are {', '.join(sorted(accepted))}"
            )
        child = node._get_node(key)
        if isinstance(child, DictConfig | ListConfig):
            check_fields(child, f"{prefix}.{key}")


def check_appended(overrides: Iterable[str], cfg: DictConfig, base_keys: Iterable[str], groups: Iterable[str]) -> None:
    """Refuse a ``+key=value`` override whose top-level ``key`` nothing reads.

    ``base_keys`` are the top-level options of the base config, ``groups`` the config groups
    (``+experiment=...`` appends a group, not an option). Dotted keys under an instantiated node
    are left to ``check_fields``.
    """
    known = set(base_keys) | set(groups)
    for override in overrides:
        if not override.startswith("+"):
            continue
        key = override.lstrip("+").split("=", 1)[0].strip()
        top = key.split(".", 1)[0].split("/", 1)[0].split("@", 1)[0]
        if top in known or "/" in key:
            continue
        raise ValueError(
            f"+{key} is not an option — {_suggest(top, known)}remove the +{top} override"
            f" (top-level options: {', '.join(sorted(set(base_keys)))})"
        )


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _matches(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` fits ``hint``; None where the hint is not one this check understands."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return is_int(value)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        answers = [_matches(value, branch) for branch in typing.get_args(hint)]
        if any(answers):
            return True
        return None if None in answers else False
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (list, tuple, set, frozenset) or hint in (list, tuple):
        return isinstance(value, list | tuple | set | frozenset | ListConfig)
    if origin in (dict, Mapping) or hint is dict:
        return isinstance(value, Mapping | DictConfig)
    return None


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}


def _type_name(hint: Any) -> str:
    """``int | None`` as ``an integer or null``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(branch) for branch in typing.get_args(hint))
    return _NAMES.get(hint, str(hint).replace("typing.", ""))


def check_types(obj: Any, prefix: str) -> None:
    """Refuse a field of the dataclass ``obj`` (and of the dataclasses it holds) whose value is not of its type.

    Only scalar values are judged; a container or object in a field is left to its owner's own
    checks. A float field must hold a finite number.
    """
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return
    try:
        hints = typing.get_type_hints(type(obj))
    except Exception:
        hints = {}
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name, None)
        option = f"{prefix}.{field.name}"
        if dataclasses.is_dataclass(value):
            check_types(value, option)
            continue
        hint = hints.get(field.name)
        if hint is None or not _scalar(value):
            continue
        if _matches(value, hint) is False:
            quote = f" (quote it: {option}='{value}')" if _matches("text", hint) else ""
            raise ValueError(f"{option}={value!r} is not {_type_name(hint)} — set {option} to one{quote}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{option}={value!r} is not a finite number — use a finite value")


def is_int(value: object) -> bool:
    """An int, not a bool (``true`` on the command line is no number)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A finite int or float, not a bool: what a numeric option may hold (records are strict JSON)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
