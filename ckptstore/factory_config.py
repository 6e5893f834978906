"""What a model factory takes, checked before it runs: the config a store records is data.

A store's model spec is a factory and a config; the factory is called as
``factory(**config)``. Before it runs (:meth:`ckpt.store.ModelSpec.build`), the
config is checked against the factory's *schema*, read from the function itself:

- its signature: every key must be one of its parameters (unless it takes
  ``**kwargs``), and every parameter without a default must be given;
- its annotations, for the types: ``int`` (not ``True``, not ``2.0``), ``float``
  (an integer is accepted), ``bool``, ``str``, a union with ``None``, and
  ``list[T]`` or ``tuple[T, ...]`` of these. A parameter annotated with anything
  else, or not at all, is not type-checked;
- its bounds, declared with :func:`config_bounds`: an inclusive ``(minimum,
  maximum)`` for a number, or for each number of a list.

>>> @config_bounds(layers=(1, 64), d_model=(1, 8192))
... def build_model(layers: int, d_model: int, bias: bool = True) -> Any: ...

A registered factory declares bounds for each of its numeric parameters, so that
no config can ask it for a model its author never meant it to build (ckpt's own
sandboxes do; ``tests/test_factory_configs.py`` checks them). What a config makes
the factory build is then compared with the stored tensors, on torch's ``meta``
device, before anything is allocated (:mod:`ckpt.store.model_build`).
"""

from __future__ import annotations

import builtins
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ckpt.errors import ModelConfigError

__all__ = ["BOUNDS_ATTR", "Field", "check_config", "config_bounds", "config_schema"]

BOUNDS_ATTR = "__ckpt_config_bounds__"
"""The attribute :func:`config_bounds` sets on a factory: parameter name -> ``(minimum, maximum)``."""

F = TypeVar("F", bound=Callable[..., Any])
_KINDS = (bool, int, float, str)


def config_bounds(**bounds: tuple[float, float]) -> Callable[[F], F]:
    """Declare the inclusive bounds of a model factory's numeric parameters (see the module docs).

    Parameters
    ----------
    **bounds
        Parameter name -> ``(minimum, maximum)``, both finite numbers.

    Returns
    -------
    Callable
        A decorator that records the bounds on the factory and returns it unchanged.
    """
    for key, bound in bounds.items():
        if (
            not isinstance(bound, tuple)
            or len(bound) != 2
            or not all(isinstance(b, int | float) and not isinstance(b, bool) and math.isfinite(b) for b in bound)
            or bound[0] > bound[1]
        ):
            msg = f"config_bounds: {key}={bound!r} is not a (minimum, maximum) pair of finite numbers"
            raise TypeError(msg)

    def declare(factory: F) -> F:
        parameters = inspect.signature(factory).parameters
        unknown = sorted(set(bounds) - set(parameters))
        if unknown:
            msg = f"config_bounds: {factory.__qualname__} has no parameter {', '.join(map(repr, unknown))}"
            raise TypeError(msg)
        setattr(factory, BOUNDS_ATTR, dict(bounds))
        return factory

    return declare


@dataclass(frozen=True)
class Field:
    """One parameter of a factory, as its config is checked."""

    name: str
    kind: type | None
    """``int``, ``float``, ``bool`` or ``str``; None: not type-checked."""
    optional: bool = False
    """``None`` is accepted."""
    sequence: bool = False
    """A list (or JSON array) of ``kind``."""
    required: bool = False
    """The parameter has no default."""
    minimum: float | None = None
    maximum: float | None = None

    @property
    def bounded(self) -> bool:
        """Whether both bounds are declared."""
        return self.minimum is not None and self.maximum is not None


def _kind(annotation: Any) -> tuple[type | None, bool, bool]:
    """(kind, optional, sequence) of an evaluated annotation; kind None when it is none of the checked ones."""
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        if len(args) != 1:
            return None, optional, False
        annotation, origin = args[0], typing.get_origin(args[0])
    if origin in (list, tuple):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if len(set(args)) == 1 and args[0] in _KINDS:
            return args[0], optional, True
        return None, optional, False
    return (annotation if annotation in _KINDS else None), optional, False


def _evaluated(annotation: Any, factory: Callable[..., Any]) -> Any:
    """An annotation as an object (``from __future__ import annotations`` keeps strings); None when it cannot be."""
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, {**vars(builtins), **getattr(factory, "__globals__", {})})  # the factory's own source
    except Exception:  # a name imported for type checkers only: not a checked type
        return None


def config_schema(factory: Callable[..., Any]) -> dict[str, Field]:
    """The schema of ``factory``'s config: parameter name -> :class:`Field` (see the module docs)."""
    bounds = getattr(factory, BOUNDS_ATTR, {})
    schema = {}
    for name, parameter in inspect.signature(factory).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD, parameter.POSITIONAL_ONLY):
            continue
        kind, optional, sequence = _kind(_evaluated(parameter.annotation, factory))
        low, high = bounds.get(name, (None, None))
        required = parameter.default is parameter.empty
        schema[name] = Field(name, kind, optional or parameter.default is None, sequence, required, low, high)
    return schema


def _problem(field: Field, value: Any) -> str | None:
    """What is wrong with ``value`` for ``field``, in words, or None."""
    if value is None:
        return None if field.optional or field.kind is None else f"is null where {field.kind.__name__} is expected"
    if field.kind is None:
        return None
    if field.sequence:
        if not isinstance(value, list | tuple):
            return f"is {value!r} where a list of {field.kind.__name__} is expected"
        for item in value:
            one = Field(field.name, field.kind, minimum=field.minimum, maximum=field.maximum)
            problem = _problem(one, item)
            if problem is not None:
                return f"holds {item!r}, which {problem}"
        return None
    exact = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}[field.kind]
    if not isinstance(value, exact) or (field.kind is not bool and isinstance(value, bool)):
        return f"is {value!r} ({type(value).__name__}) where {field.kind.__name__} is expected"
    if isinstance(value, int | float):  # field.kind is int or float: str and bool were returned above
        if not math.isfinite(value):
            return f"is {value!r}, not a finite number"
        if field.minimum is not None and value < field.minimum:
            return f"is {value!r}, below its minimum {field.minimum!r}"
        if field.maximum is not None and value > field.maximum:
            return f"is {value!r}, above its maximum {field.maximum!r}"
    return None


def check_config(factory: Callable[..., Any], config: Mapping[str, Any], name: str, where: str) -> None:
    """Raise :class:`ModelConfigError`, naming the key, unless ``config`` fits ``factory``'s schema.

    Parameters
    ----------
    factory
        The imported factory.
    config
        The keyword arguments a store records for it.
    name, where
        The factory's ``module:function`` name and the store, for the message.
    """
    schema = config_schema(factory)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(factory).parameters.values())
    problem = None
    for key, value in config.items():
        field = schema.get(key)
        if field is None and not takes_any:
            problem = f"it has the key {key!r}, which is none of the factory's ({', '.join(schema) or 'none'})"
        elif field is not None and (wrong := _problem(field, value)) is not None:
            problem = f"{key!r} {wrong}"
        if problem is not None:
            break
    missing = [key for key, field in schema.items() if field.required and key not in config]
    if problem is None and missing:
        problem = f"it lacks {', '.join(map(repr, missing))}, which the factory needs"
    if problem is not None:
        msg = (
            f"the model config of {where} does not fit {name}: {problem}; record the config the run's model was "
            "built with (ckpt set-model STORE --model ... --config ...)"
        )
        raise ModelConfigError(msg)
