"""Configuration errors as the operator reads them: one line per problem, starting with the key's dotted path
(``sources[edge-a].max_ack_pending: ...``), naming the environment variable a value came from; never a secret.

:class:`~bridge.errors.ConfigError` carries those lines; :func:`format_config_error` renders it as the CLI prints it.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from bridge.config.env import ENV_PREFIX, LoadContext, Loc
from bridge.config.models import BridgeConfig
from bridge.config.templates import NOT_DEFAULTS
from bridge.config.validators import ERROR_TYPE, SOURCE_NAME, show
from bridge.errors import ConfigError

_REQUIRED_HINTS = {
    "target": f'a [target] table, with at least stream = "<aggregate stream>" (or {ENV_PREFIX}TARGET__STREAM)',
    "target.stream": "the aggregate stream's name",
    "sources.name": "a unique name for this source (letters, digits, '_' and '-', up to 64)",
    "sources.stream": "the name of the stream to replicate from this source",
}

_TYPE_MESSAGES = {
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be an array",
    "model_type": "must be a table",
    "model_attributes_type": "must be a table",
    "dict_type": "must be a table",
    "path_type": "must be a file path (a string)",
}


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class holding the keys at ``loc`` (list indices skipped), or None past a non-model."""
    model: type[BaseModel] = BridgeConfig
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        found = _find_model(info.annotation) if info is not None else None
        if found is None:
            return None
        model = found
    return model


def _find_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _find_model(arg)
        if found is not None:
            return found
    return None


def _unknown_key_message(loc: Loc, hidden: Collection[str] = ()) -> str:
    key = str(loc[-1])
    model = _model_at(loc[:-1])
    if model is None:
        return "unknown key"
    allowed = [name for name in model.model_fields if name not in hidden]
    close = difflib.get_close_matches(key.lower(), allowed, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown key{hint}; allowed here: {', '.join(allowed)}"


def _describe_error(err: ErrorDetails, loc: Loc, hidden: Collection[str] = ()) -> str:
    """The problem at ``loc``, for the operator; ``hidden``: keys an unknown key's hint does not offer."""
    error_type = err["type"]
    if error_type == ERROR_TYPE:
        return err["msg"]
    generic = ".".join(str(p) for p in loc if isinstance(p, str))
    if error_type == "missing":
        hint = _REQUIRED_HINTS.get(generic)
        return f"required: {hint}" if hint else "required"
    if error_type == "extra_forbidden":
        # Never echo the value: it may be a secret under a misspelt key.
        return _unknown_key_message(loc, hidden)
    # Anything under an auth table may be a secret, even a value of the wrong type.
    secret = "auth" in loc
    got = " (value not shown: it may be a secret)" if secret else f" (got {show(err.get('input'))})"
    if error_type == "literal_error":
        return f"must be one of {err.get('ctx', {}).get('expected', '?')}{got}"
    if generic == "sources" and error_type == "list_type":
        return f"must be an array of tables: write one [[sources]] table per source{got}"
    message = _TYPE_MESSAGES.get(error_type)
    if message is None:
        text = err["msg"]
        message = text[:1].lower() + text[1:]
    return message + got


def _key_path(loc: Loc, sources_raw: Any) -> str:
    path = ""
    for position, part in enumerate(loc):
        if isinstance(part, int):
            label = str(part)
            if position == 1 and loc[0] == "sources":
                label = _source_label(part, sources_raw)
            path += f"[{label}]"
        else:
            path += f".{part}" if path else part
    return path or "(top level)"


def _source_label(index: int, sources_raw: Any) -> str:
    """The source's name where it identifies the source unambiguously, else its index."""
    if not isinstance(sources_raw, list) or index >= len(sources_raw):
        return str(index)
    names = [item.get("name") if isinstance(item, dict) else None for item in sources_raw]
    name = names[index]
    if isinstance(name, str) and SOURCE_NAME.fullmatch(name) and not name.isdigit() and names.count(name) == 1:
        return name
    return str(index)


def _env_origin(loc: Loc, env_keys: Mapping[Loc, str]) -> str | None:
    for length in range(len(loc), 0, -1):
        variable = env_keys.get(loc[:length])
        if variable is not None:
            return variable
    return None


def validation_problems(exc: ValidationError, ctx: LoadContext) -> list[str]:
    lines: list[str] = []
    # a default that fails fails for every source taking it: one line, naming the first of them and the count
    from_defaults: dict[str, list[str]] = {}
    for err in exc.errors(include_url=False):
        loc: Loc = tuple(err["loc"])
        at = _default_of(loc, ctx)
        if at is not None:
            origin = _env_origin(at, ctx.env_keys)
            line = f"{_key_path(at, None)}: {_describe_error(err, loc, NOT_DEFAULTS)}"
            if origin is not None:
                line += f" [from environment variable {origin}]"
            if line not in from_defaults:
                from_defaults[line] = []
                lines.append(line)
            from_defaults[line].append(_key_path(loc[:2], ctx.sources_raw))
            continue
        line = f"{_key_path(loc, ctx.sources_raw)}: {_describe_error(err, loc)}"
        origin = _env_origin(loc, ctx.env_keys)
        if origin is not None:
            line += f" [from environment variable {origin}]"
        if line not in lines:
            lines.append(line)
    return [_with_sources(line, from_defaults.get(line)) for line in lines]


def _default_of(loc: Loc, ctx: LoadContext) -> Loc | None:
    """For an error in a value a source took from ``[source_defaults]``: the default's key path."""
    if len(loc) < 3 or loc[0] != "sources" or not isinstance(loc[1], int) or not isinstance(loc[2], str):
        return None
    if (loc[1], loc[2]) not in ctx.defaulted:
        return None
    return ("source_defaults", *loc[2:])


def _with_sources(line: str, sources: list[str] | None) -> str:
    if not sources:
        return line
    more = f" and {len(sources) - 1} more" if len(sources) > 1 else ""
    return f"{line} (as applied to {sources[0]}{more})"


def format_config_error(err: ConfigError) -> str:
    """The error as the CLI prints it: a header naming where the configuration came from, one line per
    problem, and no traceback."""
    header = "nats-bridge: invalid configuration" + (f" ({err.source})" if err.source else "")
    return "\n".join([header, *(f"  {problem}" for problem in err.problems)])
