"""Entry point of the `tyard` command. Sub-commands live in sibling modules, each with
`register(app)`."""

from __future__ import annotations

import typer

from tensoryard.cli import (
    access,
    agent,
    chaos,
    cluster,
    data,
    demo,
    images,
    jobs,
    k8s,
    models,
    nodes,
    pipelines,
    serving,
    sim,
    top,
)

app = typer.Typer(
    name="tyard",
    help="tensoryard: submit, watch and schedule training jobs on a shared GPU cluster.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for module in (
    jobs,
    access,
    demo,
    sim,
    data,
    cluster,
    pipelines,
    models,
    k8s,
    nodes,
    agent,
    top,
    chaos,
    serving,
    images,
):
    module.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
