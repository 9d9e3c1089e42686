"""The settings as flags: one flag per setting of the model, and the settings a command's flags give."""

import argparse
from enum import Enum
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from ..settings import ENV_PREFIX, Settings


def settings_from(args: argparse.Namespace) -> Settings:
    """Command-line flags over environment variables over the settings file over the defaults."""
    from ..startup import load_settings

    return load_settings({k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None})


def plain(text: str) -> str:
    """Help text as a terminal shows it: without the double backticks docstrings mark code with."""
    return text.replace("``", "'")


def flag_name(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for every setting, made from the settings model: a new setting gets its flag with no second edit.

    A flag left out is ``None`` and leaves the setting to the environment, the settings file or its default.
    """
    for name, field in Settings.model_fields.items():
        given = not field.is_required() and field.default_factory is None and field.default not in (None, ())
        shown = f"; default {field.default}" if given else ""
        if field.is_required():  # a flag to argparse, as the variable or the settings file may give it instead
            shown = "; REQUIRED: this flag, the variable or the settings file"
        description = plain(field.description or name).replace("%", "%%")
        parser.add_argument(
            flag_name(name), dest=name, help=f"{description} ({ENV_PREFIX}{name.upper()}{shown})", **_flag_kind(field)
        )


def _flag_kind(field: FieldInfo) -> dict[str, Any]:
    """argparse's type, choices or action for a setting; anything else is passed as text, for the model to parse."""
    annotation = field.annotation
    if get_origin(annotation) in (Union, UnionType):  # an optional setting, X | None; wider unions as text
        kinds = [arg for arg in get_args(annotation) if arg is not type(None)]
        annotation = kinds[0] if len(kinds) == 1 else str
    if get_origin(annotation) is Literal:
        choices = list(get_args(annotation))
        return {"choices": choices, "type": type(choices[0])}
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return {"choices": [member.value for member in annotation]}
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation in (int, float):
        return {"type": annotation}
    return {}
