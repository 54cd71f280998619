"""A user's mistake is one line and exit code 2; an internal error keeps its traceback.

Tasks and methods know nothing of the harness, so they signal a mistake in what the user
asked for the plain way: ``ValueError`` (a bad value) or ``FileNotFoundError`` (missing data),
with a message ``<what is wrong, naming the value> — <how to fix it>``. The harness turns
those into ``UserError`` wherever it prepares a run from the config (``user_errors``), and
every command-line entry point prints a ``UserError`` or a Hydra config error as
``error: <message>`` (``cli``). ``HYDRA_FULL_ERROR=1`` shows the traceback of any of them.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import yaml
from hydra.errors import (
    ConfigCompositionException,
    InstantiationException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

#: What a task or method raises for a mistake in the user's config or files.
MISTAKES = (ValueError, FileNotFoundError)

#: Whether the user asked for the traceback behind a one-line error (``HYDRA_FULL_ERROR=1``);
#: ``cli`` reads it before it sets the variable for Hydra's own reasons.
_FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR") == "1"


def _folder_option(value: Any, option: str) -> Any:
    """``${folder:${results_dir},results_dir}``: a folder option used in a path, refused when empty.

    Hydra makes its log folder from ``results_dir`` before any code of ours runs; an empty value
    would put it at the file system's root.
    """
    if value is None or not str(value).strip():
        raise UserError(f"{option}={value!r} is empty — set {option} to a folder, e.g. {option}=results")
    return value


OmegaConf.register_new_resolver("folder", _folder_option, replace=True)


def show_tracebacks() -> bool:
    """Whether a user's mistake should show its traceback instead of one line (``HYDRA_FULL_ERROR=1``)."""
    return _FULL_ERROR


class UserError(Exception):
    """A mistake in what the user asked for: printed as ``error: <message>``, exit code 2."""


@contextmanager
def user_errors(mistakes: tuple[type[Exception], ...] = MISTAKES) -> Iterator[None]:
    """Treat a ``mistakes`` exception raised inside (also through Hydra's ``instantiate``) as a ``UserError``."""
    try:
        yield
    except UserError:
        raise
    except InstantiationException as error:
        cause = error.__cause__
        if isinstance(cause, mistakes):
            raise UserError(one_line(str(cause))) from cause
        raise
    except mistakes as error:
        raise UserError(one_line(str(error))) from error


def one_line(message: str) -> str:
    """``message`` with its line breaks folded, so that an error stays one line."""
    return " ".join(part.strip() for part in message.strip().splitlines() if part.strip())


def _config_message(error: Exception) -> str:
    """A Hydra config error as ``<what> — <fix>``."""
    if isinstance(error, MissingConfigException) and error.options is not None and error.missing_cfg_file:
        group, _, name = error.missing_cfg_file.rpartition("/")
        return f"{group}={name} is not a config in conf/{group}/ — choose one of: {', '.join(error.options)}"
    if isinstance(error, OverrideParseException):
        reason = error.message.splitlines()[0] if error.message else "syntax error"
        return f"cannot parse the override {error.override!r} ({reason}) — check its quoting and brackets"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    what = lines[0].rstrip(".") if lines else type(error).__name__
    append = next((line for line in lines[1:] if line.startswith("To append to your config use ")), None)
    if append is not None and what.startswith("Could not override "):
        key = what.removeprefix("Could not override ").strip("'")
        override = append.removeprefix("To append to your config use ")
        return f"{key} is not in the config — check the spelling, or add a new field with {override}"
    cause = error.__cause__
    if isinstance(cause, OmegaConfBaseException):
        what = f"{what} ({one_line(str(cause)).split(' full_key:')[0]})"
    return f"{what} — check the override against conf/ (python -m harness.run --cfg job prints the config)"


def cli(main: Callable[[], Any]) -> None:
    """Run a command-line entry point, printing a user's mistake as one line with exit code 2."""
    global _FULL_ERROR
    full = _FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR") == "1"
    # Hydra re-raises instead of printing its own report, so the mistake can be told apart here.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except UserError as error:
        if full:
            raise
        _exit(str(error))
    except (ConfigCompositionException, OverrideParseException) as error:
        if full:
            raise
        _exit(_config_message(error))
    except OmegaConfBaseException as error:
        if full:
            raise
        # A resolver's own refusal (``${folder:...}``) says what to fix itself; OmegaConf keeps only its text.
        resolver = f"{UserError.__name__} raised while resolving interpolation: "
        if str(error).startswith(resolver):
            _exit(one_line(str(error).removeprefix(resolver)).split(" full_key:")[0])
        # An interpolation that cannot resolve (``${forms.${scale}.model}`` with an unknown scale).
        _exit(f"{one_line(str(error)).split(' full_key:')[0]} — check the overrides (scale is cluster or cpu)")
    except yaml.YAMLError as error:
        if full:
            raise
        mark = getattr(error, "problem_mark", None)
        where = f"{mark.name}:{mark.line + 1}" if mark is not None else "a config file"
        _exit(f"{where}: not valid YAML ({getattr(error, 'problem', None) or error}) — fix that line")
    except OSError as error:
        if full or not _raised_by_hydra(error):
            raise
        _exit(
            f"cannot write {error.filename} ({error.strerror}) — set results_dir to a folder you can write"
            " (Hydra keeps its logs under results_dir/.hydra)"
        )


def _raised_by_hydra(error: BaseException) -> bool:
    """Whether ``error`` comes from Hydra's own file handling (its output folder), not from the task.

    That is: the innermost frame outside the standard library is Hydra's.
    """
    stdlib = sysconfig.get_paths()["stdlib"]
    owner = ""
    frame = error.__traceback__
    while frame is not None:
        if not frame.tb_frame.f_code.co_filename.startswith(stdlib):
            owner = frame.tb_frame.f_globals.get("__name__", "")
        frame = frame.tb_next
    return owner.startswith("hydra.")


def _exit(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)
