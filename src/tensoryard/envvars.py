"""The ``TYARD_*`` environment contract, declared once.

Every environment variable tensoryard sets or reads is declared here: its name, its type, its
default, who sets it, who reads it and one line of what it means. Code reads a variable through
its typed accessor (``envvars.HOME.get()``) and sets one by its name (``{envvars.NODE.name:
...}``) instead of spelling ``"TYARD_..."`` in a string; a unit test fails on a ``TYARD_`` string
literal anywhere else in the package, and ``docs/environment.md`` is generated from this module
(``python -m tensoryard.envvars --markdown``).

This module sits at the bottom of the import graph: it imports only the standard library and
:mod:`tensoryard.errors`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from tensoryard.errors import ConfigError

__all__ = ["DEFAULT_PORT", "VARIABLES", "EnvVar", "default_home", "markdown_table"]

T = TypeVar("T")

DEFAULT_PORT = 8642
"""The control plane's default port (``tyard server``; clients fall back to it on loopback)."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


_PARSERS: dict[str, Callable[[str], object]] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": _bool,
    "path": lambda text: Path(text).expanduser(),
}


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One variable of the contract. ``get`` parses it (``None`` or ``default`` when unset or
    empty); a value that does not parse raises :class:`ConfigError` naming the variable."""

    name: str
    kind: str  # str | int | float | bool | path
    default: T | None
    set_by: str
    read_by: str
    doc: str

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The text as set, or None when unset or empty."""
        value = (os.environ if environ is None else environ).get(self.name)
        return value if value else None

    def get(self, environ: Mapping[str, str] | None = None) -> T | None:
        text = self.raw(environ)
        if text is None:
            return self.default
        try:
            return _PARSERS[self.kind](text)  # type: ignore[return-value]
        except ValueError as exc:
            raise ConfigError(
                f"{self.name}={text!r} is not a valid {self.kind} ({exc}) "
                f"(fix: {self.doc[0].lower() + self.doc[1:]} — set a {self.kind} or unset it)"
            ) from exc

    def require(self, environ: Mapping[str, str] | None = None) -> T:
        """The value, or :class:`ConfigError` when it is unset and has no default."""
        value = self.get(environ)
        if value is None:
            raise ConfigError(f"{self.name} is not set (fix: {self.set_by} sets it: {self.doc})")
        return value

    def present(self, environ: Mapping[str, str] | None = None) -> bool:
        return self.raw(environ) is not None


VARIABLES: dict[str, EnvVar[object]] = {}


def _var(
    name: str, kind: str, default: T | None, *, set_by: str, read_by: str, doc: str
) -> EnvVar[T]:
    full = f"TYARD_{name}"
    if full in VARIABLES:
        raise AssertionError(f"{full} is declared twice")
    var: EnvVar[T] = EnvVar(full, kind, default, set_by, read_by, doc)
    VARIABLES[full] = var  # type: ignore[assignment]
    return var


# --- the user's side: CLI, SDK, control plane process ------------------------------------------

HOME: EnvVar[Path] = _var(
    "HOME",
    "path",
    None,
    set_by="the user",
    read_by="server, CLI, SDK",
    doc="Directory of the embedded control plane's database, admin token and run dirs "
    "(default ~/.tyard).",
)
SERVER: EnvVar[str] = _var(
    "SERVER",
    "str",
    None,
    set_by="the user",
    read_by="CLI, SDK (client.py)",
    doc="URL of the control plane (default: the local one on port 8642).",
)
TOKEN: EnvVar[str] = _var(
    "TOKEN",
    "str",
    None,
    set_by="the user",
    read_by="CLI, SDK (client.py)",
    doc="API token sent as the bearer credential.",
)


def default_home() -> Path:
    """`$TYARD_HOME`, else `~/.tyard`: the database, admin token and job run dirs live here."""
    return HOME.get() or (Path.home() / ".tyard")


def markdown_table() -> str:
    """The contract as a Markdown table (docs/environment.md is this, checked by a test)."""
    rows = [
        "| variable | type | default | set by | read by | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for var in VARIABLES.values():
        default = "" if var.default is None else f"`{var.default}`"
        rows.append(
            f"| `{var.name}` | {var.kind} | {default} | {var.set_by} | {var.read_by} | {var.doc} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # pragma: no cover - `python -m tensoryard.envvars --markdown`
    sys.stdout.write(markdown_table())
