"""Typed, frozen experiment configs read from YAML and `key=value` overrides.

    @dataclasses.dataclass(frozen=True)
    class MyConfig:
        env_name: str = "CartPole-v1"
        hidden_sizes: tuple = (64,)
        target: float | None = None

        def __post_init__(self):
            check_types(self)            # YAML's 1 -> 1.0 for a float field, lists -> tuples

    config = load(MyConfig, "experiments/configs/x.yaml", ["--hidden_sizes=[32, 32]"])

One reader for every config of the project (`popeval.strategies.EvolveConfig`, the RL agents'
configs): an unknown key or a value of the wrong type raises an error naming the key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from popeval.environments.registry import did_you_mean

__all__ = ["check_types", "parse_overrides", "join_values", "takes_value", "from_mapping", "load", "read"]

#: A number in exponent notation (`1e-3`, `3E5`, `1.0e3`, `.5e1`): a float by YAML 1.2's rule, a string
#: by YAML 1.1's (PyYAML's), which wants a dot and a signed exponent.
_EXPONENT_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+")
#: A negative number on a command line (`-5`, `-0.5`, `-.5`, `-1e-3`, `-.inf`): a value, not an option.
_NEGATIVE_NUMBER = re.compile(r"-([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|-\.?inf", re.IGNORECASE)


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int):
        super().__init__(f"key {key!r} appears twice (line {line})")


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that repeats a key (PyYAML keeps the last), and
    reading numbers in exponent notation as floats at any depth (`{learning_rate: 1e-3}`)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` merges keys that the mapping's own may override
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, typing.Hashable) and key in seen:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep)


_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+.0123456789"))


def _safe_load(text: str, where: str, what: str = "readable YAML") -> Any:
    """`yaml.safe_load(text)` with duplicate keys refused and `{key:value}` caught, naming `where`."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no tags that run code
    except _DuplicateKey as e:
        raise ValueError(f"{where}: {e}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not {what} ({' '.join(str(e).split())[:200]})") from None
    _check_flow_keys(data, where)
    return data


def _check_flow_keys(data: Any, where: str) -> None:
    """Refuses `{learning_rate:0.1}`, which YAML reads as the key `"learning_rate:0.1"` with
    no value: in a flow mapping a colon separates a key from its value only before a space."""
    if not isinstance(data, dict):
        return
    for k, v in data.items():
        if isinstance(k, str) and ":" in k and v is None:
            name, _, value = k.partition(":")
            raise ValueError(f"{where}: key {k!r} has no value; YAML needs a space after the colon "
                             f"({{{name}: {value}}}, not {{{k}}})")
        _check_flow_keys(v, where)


def _coerce(cls: type, name: str, value: Any) -> Any:
    hint = typing.get_type_hints(cls)[name]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    allowed = args if origin in (typing.Union, types.UnionType) else (hint,)  # Optional[X] or X | None
    for t in allowed:
        if t is type(None) and value is None:
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is tuple and isinstance(value, (list, tuple)):
            return tuple(value)
        if t is not type(None) and isinstance(value, t) and not (t is int and isinstance(value, bool)):
            return value
    names = " or ".join(getattr(t, "__name__", str(t)) for t in allowed)
    raise TypeError(f"config key {name!r}: expected {names}, got {value!r} ({type(value).__name__})")


def check_types(config: Any) -> None:
    """Checks every field of a frozen dataclass against its annotation, in place (call it
    from `__post_init__`): ints are accepted for floats, lists for tuples.

    Raises:
        TypeError naming the key, the expected type and the value.
    """
    for f in dataclasses.fields(config):
        object.__setattr__(config, f.name, _coerce(type(config), f.name, getattr(config, f.name)))


def takes_value(token: str) -> bool:
    """Whether a command-line token after an option is its value: anything but another option
    (`-x`, `--x`); a negative number (`-5`, `-1e-3`, `-.inf`) is a value."""
    return not token.startswith("-") or bool(_NEGATIVE_NUMBER.fullmatch(token))


def join_values(argv: list[str], known: typing.Container[str] = ()) -> list[str]:
    """`["--key", "value"]` -> `["--key=value"]`, argparse's two spellings made one, for every
    `--key` not in `known` (options that argparse parses itself, flags without a value among
    them). A token that starts with `-` is the next option, not a value, unless it is a negative
    number; after `--` nothing is joined."""
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return out + argv[i:]
        ours = token.startswith("--") and "=" not in token and token not in known
        if ours and i + 1 < len(argv) and takes_value(argv[i + 1]):
            out.append(f"{token}={argv[i + 1]}")
            i += 2
        else:
            out.append(token)
            i += 1
    return out


def parse_overrides(items: list[str]) -> dict:
    """`["--key=value", "--key2", "value2", "key3=value3"]` -> `{key: value}` (values in YAML
    syntax; `-` in keys reads as `_`).

    Raises:
        ValueError naming a key without a value, or an argument that is no `key=value`.
    """
    out = {}
    for item in join_values(list(items)):
        setting = item[2:] if item.startswith("--") else item
        key, sep, text = setting.partition("=")
        if not sep and item.startswith("--"):
            raise ValueError(f"config key {key!r} needs a value: --{key}=VALUE or --{key} VALUE (YAML syntax)")
        if not sep:
            raise ValueError(f"unexpected argument {item!r}: config keys are set with --key=value or --key value")
        out[key.replace("-", "_")] = _safe_load(text, f"override {setting!r}")
    return out


def from_mapping(cls: type, data: dict) -> Any:
    """`cls(**data)`, refusing unknown keys with the close matches."""
    fields = [f.name for f in dataclasses.fields(cls)]
    for k in data:
        if k not in fields:
            raise ValueError(f"unknown config key {k!r}" + did_you_mean(k, fields))
    return cls(**data)


def load(cls: type, path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None) -> Any:
    """A `cls` from a YAML file (or the defaults when `path` is None) and overrides
    (`["key=value", ...]` in YAML syntax, or a dict).

    Raises:
        ValueError / TypeError naming an unreadable file, an unknown or a mistyped key.
    """
    return from_mapping(cls, read(path, overrides))


def read(path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None) -> dict:
    """The mapping of a YAML config file (`{}` when `path` is None) updated with overrides.

    Raises:
        ValueError naming an unreadable file or override.
    """
    data: dict = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not a readable YAML config ({e})") from None
        data = _safe_load(text, str(path), "a readable YAML config") or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a config file holds a mapping of keys to values")
    data.update(overrides if isinstance(overrides, dict) else parse_overrides(overrides or []))
    return data
