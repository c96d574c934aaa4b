"""The one typed settings layer every recipe under ``recipes/`` is read through.

A recipe (or a section of one) is a dataclass whose fields are declared with :func:`setting`: a
default and a help string, as TRL's configs do with ``field(metadata={"help": ...})``. :func:`load`
reads a YAML file, :func:`from_dict` builds the dataclass from a mapping: the same strict rules for
every recipe:

* an unknown key is an error naming the file, the section and the allowed keys (a typo never falls
  back to a default silently); a key that moved elsewhere says where (the class attribute ``MOVED``: key → new home);
* a renamed key still loads under its old name (the class attribute ``RENAMED``: old key → new key), with a
  :class:`RenamedKeyWarning` naming the new key; giving both the old and the new name is an error;
* a missing required key (a field without a default) is an error;
* every value is checked against the field's type: ``bool``, ``int`` (a whole float is accepted),
  ``float`` (an int is widened), ``str``, ``Literal[...]`` choices, ``X | None``, ``list``/``tuple``,
  ``dict``, ``Any``, and nested settings dataclasses (recursively, with the dotted path in errors);
  ``null`` for a list, mapping or section (a key whose entries are all commented out) means empty / defaults;
* ``__post_init__`` of each dataclass keeps only what types cannot say (ranges, cross-field rules).

:func:`document` renders the fields (key, type, default, help) as a Markdown table; the docs'
settings reference (docs/SETTINGS.md) is generated from it and a test keeps the two equal.

Deliberately simplified: no schema library, no coercion between kinds (``"1"`` is not an int).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
import warnings
from dataclasses import MISSING
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")


def setting(default: Any = MISSING, *, help: str, factory: Any = MISSING) -> Any:
    """A settings field: ``default`` (or ``factory`` for mutable defaults) and its ``help`` text."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"help": help})


def derived(default: Any = MISSING, *, factory: Any = MISSING) -> Any:
    """A field that is not a recipe key (set by the code that loads the recipe, e.g. its file name)."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"derived": True})


def _keys(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("derived")}


def check_keys(where: str, given: Any, allowed: Any, moved: dict[str, str] | None = None) -> None:
    """THE unknown-key error: ``given`` keys outside ``allowed`` fail, naming where and what is allowed."""
    unknown = sorted(set(given) - set(allowed), key=str)
    if not unknown:
        return
    hints = [f"{k!r} now lives in {moved[k]}" for k in unknown if moved and k in moved]
    raise ValueError(
        f"{where}: unknown keys {unknown} (allowed: {sorted(allowed)})" + ("; " + "; ".join(hints) if hints else "")
    )


class RenamedKeyWarning(UserWarning):
    """A recipe used a key's old name: it still loads, and the message names the new key."""


def renamed_keys(where: str, key: str, raw: dict[str, Any], renamed: dict[str, str] | None) -> dict[str, Any]:
    """``raw`` (the section ``key`` of ``where``) with each old key of ``renamed`` (old → new) under its new
    name, warning once per old key found; both names at once is an error (which would win is not obvious)."""
    if not renamed or not set(raw) & set(renamed):
        return raw
    dotted = lambda name: f"{key}.{name}" if key else name  # noqa: E731
    out = dict(raw)
    for old, new in renamed.items():
        if old not in out:
            continue
        if new in out:
            raise ValueError(f"{where}: {dotted(old)} is the old name of {dotted(new)}; give only {dotted(new)}")
        out[new] = out.pop(old)
        warnings.warn(
            f"{where}: {dotted(old)} is now {dotted(new)} (the old name still loads; rename it)",
            RenamedKeyWarning,
            stacklevel=3,
        )
    return out


def read_yaml(path: str | Path, what: str = "recipe") -> dict[str, Any]:
    """A YAML file's top-level mapping (an empty file is ``{}``); clear errors for a missing file,
    invalid YAML or a top level that is not a mapping."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} not found: {p}")
    # here, not at module import: a run on the defaults skips it
    import yaml

    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{p}: top level must be a mapping, got {type(data).__name__}")
    return data


def load(cls: type[T], path: str | Path, what: str | None = None) -> T:
    """Read ``path`` and build ``cls`` from it (:func:`from_dict` with the file's name in errors)."""
    return from_dict(cls, read_yaml(path, what or f"{cls.__name__} recipe"), str(path))


def from_dict(cls: type[T], raw: Any, where: str, key: str = "") -> T:
    """Build the settings dataclass ``cls`` from a mapping (``None`` = all defaults), strictly.
    ``where`` names the file (or recipe) in errors, ``key`` the dotted section inside it."""
    at = f"{where}: {key}" if key else where
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{at}: expected a mapping, got {type(raw).__name__}")
    fs = _keys(cls)
    raw = renamed_keys(where, key, raw, getattr(cls, "RENAMED", None))
    check_keys(at, raw, fs, getattr(cls, "MOVED", None))
    missing = [n for n, f in fs.items() if f.default is MISSING and f.default_factory is MISSING and n not in raw]
    if missing:
        what = "; ".join(f"{n}: {fs[n].metadata.get('help', '')}" for n in missing)
        raise ValueError(f"{at}: missing required key(s) {missing} ({what})")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _value(hints[name], value, where, f"{key}.{name}" if key else name) for name, value in raw.items()}
    try:
        return cls(**kwargs)
    # a rule of the class's __post_init__: say where
    except ValueError as e:
        raise ValueError(f"{at}: {e}") from None


def to_dict(obj: Any) -> Any:
    """Plain data (dicts, lists, scalars) :func:`from_dict` reads back into an equal object."""
    if dataclasses.is_dataclass(obj):
        return {name: to_dict(getattr(obj, name)) for name in _keys(type(obj))}
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_dict(x) for k, x in obj.items()}
    return obj


def _name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple, dict):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return f"{'list' if origin is tuple else origin.__name__}[{', '.join(_name(a) for a in args)}]"
    if dataclasses.is_dataclass(tp):
        return "section"
    return "any" if tp is Any else getattr(tp, "__name__", str(tp))


def _value(tp: Any, v: Any, where: str, key: str) -> Any:
    """``v`` (the value of ``key``) checked against the type ``tp``, converted int → float, list → tuple."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return v
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, v, where, key)
    if origin in (Union, types.UnionType):
        return _union_value(tp, v, where, key)
    if origin is Literal:
        if v not in typing.get_args(tp):
            raise ValueError(f"{where}: {key} must be one of {list(typing.get_args(tp))}, got {v!r}")
        return v
    if tp in _SCALARS:
        return _scalar_value(tp, v, f"{where}: {key} must be")
    if v is None and (origin in (list, tuple, dict) or tp is dict):  # `key:` with every entry commented out
        return () if origin is tuple else [] if origin is list else {}
    if origin in (list, tuple):
        return _list_value(tp, v, where, key)
    if origin is dict or tp is dict:
        if not isinstance(v, dict):
            raise ValueError(f"{where}: {key} must be a mapping, got {v!r}")
        kt, vt = typing.get_args(tp) or (Any, Any)
        return {_value(kt, k, where, key): _value(vt, x, where, f"{key}.{k}") for k, x in v.items()}
    raise TypeError(f"{where}: {key}: the settings layer cannot read fields of type {tp!r}")


def _union_value(tp: Any, v: Any, where: str, key: str) -> Any:
    """``X | Y | None``: null where the union allows it, else the first member type that reads ``v``."""
    args = typing.get_args(tp)
    if v is None:
        if type(None) in args:
            return None
        raise ValueError(f"{where}: {key} must be {_name(tp)}, got null")
    for a in args:
        if a is type(None):
            continue
        try:
            return _value(a, v, where, key)
        except ValueError:
            continue
    raise ValueError(f"{where}: {key} must be {_name(tp)}, got {v!r}")


_SCALARS = (bool, int, float, str)


def _scalar_value(tp: type, v: Any, bad: str) -> Any:
    """``bool`` / ``int`` (a whole float is accepted) / ``float`` (an int is widened, finite only) / ``str``;
    ``bad`` starts the error (``"<where>: <key> must be"``)."""
    if tp is bool:
        if not isinstance(v, bool):
            raise ValueError(f"{bad} true or false, got {v!r}")
        return v
    if tp is int:
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
            raise ValueError(f"{bad} an integer, got {v!r}")
        return int(v)
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{bad} a number, got {v!r}")
        return float(v)
    if not isinstance(v, str):
        raise ValueError(f"{bad} a string, got {v!r}")
    return v


def _list_value(tp: Any, v: Any, where: str, key: str) -> list | tuple:
    """A ``list[X]`` / ``tuple[X, ...]``: each item read as ``X``, its index (and ``name``, if any) in errors."""
    origin = typing.get_origin(tp)
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"{where}: {key} must be a list, got {v!r}")
    (item,) = [a for a in typing.get_args(tp) if a is not Ellipsis] or [Any]
    named = lambda x: f" ({x['name']})" if isinstance(x, dict) and isinstance(x.get("name"), str) else ""  # noqa: E731
    out = [_value(item, x, where, f"{key}[{i}]{named(x)}") for i, x in enumerate(v)]
    return tuple(out) if origin is tuple else out


def _default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """``(key, type, default, help)`` per setting of ``cls``, nested sections flattened with dots."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in _keys(cls).values():
        key, tp = prefix + f.name, hints[f.name]
        help_text = f.metadata.get("help")
        if not help_text:
            raise ValueError(f"{cls.__name__}.{f.name}: a setting without help text")
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out.append((key, "section", "", help_text))
            out.extend(rows(tp, key + "."))
            continue
        d = _default(f)
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list and typing.get_args(tp) else None
        if isinstance(item, type) and dataclasses.is_dataclass(
            item
            # a list of sections: each entry's keys as `key[].name`
        ):
            out.append(
                (key, "list[section]", "required" if d is MISSING else "`" + _yaml_scalar(to_dict(d)) + "`", help_text)
            )
            out.extend(rows(item, key + "[]."))
            continue
        if d is MISSING:
            shown = "required"
        elif len(_yaml_scalar(to_dict(d))) > 60:
            shown = "(long: see the recipe)"
        else:
            shown = "`" + _yaml_scalar(to_dict(d)) + "`"
        out.append((key, _name(tp), shown, help_text))
    return out


def _yaml_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v) if (not v or v != v.strip() or ":" in v or "\n" in v) else v
    return json.dumps(v)


def document(cls: type) -> str:
    """A Markdown table of every setting of ``cls`` (key, type, default, help)."""
    lines = ["| key | type | default | what |", "|---|---|---|---|"]
    for key, tp, default, help_text in rows(cls):
        cell = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
        lines.append(f"| `{key}` | {cell(tp)} | {cell(default)} | {cell(help_text)} |")
    return "\n".join(lines)
