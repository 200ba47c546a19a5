"""Entry point of the `tyard` command. Sub-commands live in sibling modules, each with
`register(app)`."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="tyard",
    help="tensoryard: submit, watch and schedule training jobs on a shared GPU cluster.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Modules that add commands to `app` through register(app).
_COMMAND_MODULES = (
    "tensoryard.cli.jobs",
    "tensoryard.cli.demo",
    "tensoryard.cli.sim",
    "tensoryard.cli.data",
)


def _register_all() -> None:
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # during bootstrap only; removed once all exist
            if exc.name != name:
                raise
            continue
        module.register(app)


def main() -> None:
    _register_all()
    app()


if __name__ == "__main__":
    main()
