"""`tyard data prepare|inspect|verify`: build and check tokenized training datasets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from tensoryard.cli._common import JsonOpt, console, die, err_console, print_json
from tensoryard.errors import DataError, TensoryardError

__all__ = ["register"]

data_app = typer.Typer(
    name="data",
    help="Prepare, inspect and verify tokenized training datasets.",
    no_args_is_help=True,
)


@contextmanager
def _bad_input_exits() -> Iterator[None]:
    """A DataError is bad input (exit 2); any other tensoryard error exits 1."""
    try:
        yield
    except DataError as exc:
        die(str(exc), 2)
    except TensoryardError as exc:
        die(str(exc), 1)


@contextmanager
def _progress(kind: str, quiet: bool) -> Iterator[Callable[[int, int], None]]:
    columns: list[Any] = [TextColumn(f"[bold]{kind}"), BarColumn()]
    if kind == "prepare":
        columns += [DownloadColumn(), TransferSpeedColumn()]
    else:
        columns += [MofNCompleteColumn()]
    columns += [TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=err_console, disable=quiet, transient=False) as bar:
        task = bar.add_task(kind, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


@data_app.command("prepare")
def prepare_cmd(
    inputs: Annotated[
        list[str],
        typer.Argument(
            help="jsonl, text or parquet files, directories or globs; local paths or fsspec "
            "URLs (file://, s3://, hdfs://).",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")],
    tokenizer: Annotated[
        str, typer.Option(help="'byte' or a path to a Hugging Face tokenizer.json.")
    ] = "byte",
    workers: Annotated[int, typer.Option(min=1, help="Tokenizer worker processes.")] = 1,
    shard_tokens: Annotated[
        int, typer.Option(min=1, help="Tokens per shard (the last shard may hold fewer).")
    ] = 1 << 26,
    text_field: Annotated[str, typer.Option(help="Text field of jsonl/parquet records.")] = "text",
    eos_token: Annotated[
        str, typer.Option(help="End-of-document token of a tokenizer.json (default: guessed).")
    ] = "",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Tokenize INPUT... into token shards and a manifest under --out.

    The output is byte-identical for any --workers. An interrupted run resumes where it
    stopped when started again with the same arguments.
    """
    from tensoryard.data.preparation import prepare

    with _bad_input_exits(), _progress("prepare", quiet or as_json) as update:
        result = prepare(
            inputs,
            tokenizer,
            out,
            workers=workers,
            shard_tokens=shard_tokens,
            text_field=text_field,
            eos_token=eos_token,
            progress=update,
        )
    man = result.manifest
    if as_json:
        print_json(man.as_dict() | {"resumed_shards": result.resumed_shards})
        return
    state = "already up to date" if result.up_to_date else "prepared"
    resumed = (
        f", {result.resumed_shards} shards kept from an earlier run"
        if (result.resumed_shards and not result.up_to_date)
        else ""
    )
    console.print(
        f"{state}: {out} — {man.num_tokens:,} tokens, {man.num_documents:,} documents, "
        f"{man.num_shards} shards ({man.dtype}){resumed}"
    )


@data_app.command("inspect")
def inspect_cmd(
    directory: Annotated[Path, typer.Argument(help="A prepared dataset directory.")],
    as_json: JsonOpt = False,
) -> None:
    """Summarise a prepared dataset's manifest (cheap: reads no shard)."""
    from tensoryard.data.format import read_index, read_manifest

    with _bad_input_exits():
        man = read_manifest(directory)
        index = read_index(directory, man)
    sizes = (index.starts[1:] - index.starts[:-1]) if man.num_shards else index.starts[:0]
    summary = man.as_dict() | {
        "dataset_id": man.dataset_id,
        "shard_tokens_min": int(sizes.min()) if len(sizes) else 0,
        "shard_tokens_max": int(sizes.max()) if len(sizes) else 0,
        "bytes": man.num_tokens * man.np_dtype.itemsize,
    }
    if as_json:
        print_json(summary)
        return
    table = Table(show_header=False, box=None)
    tok = man.tokenizer
    rows = [
        ("dataset", str(directory)),
        ("dataset id", man.dataset_id),
        ("format", f"tensoryard-tokens v{man.format_version}"),
        ("tokens", f"{man.num_tokens:,} ({man.dtype}, {summary['bytes']:,} bytes)"),
        ("documents", f"{man.num_documents:,}"),
        ("shards", f"{man.num_shards} × ≤{man.shard_tokens:,} tokens"),
        (
            "tokenizer",
            f"{tok.get('name')} (vocab {tok.get('vocab_size')}, eos {tok.get('eos_id')})",
        ),
        ("tokenizer hash", str(tok.get("hash"))),
    ]
    rows += [
        (f"source {i}", f"{s['url']} ({s['format']}, {s['bytes']:,} bytes)")
        for i, s in enumerate(man.sources)
    ]
    for key, value in rows:
        table.add_row(f"[bold]{key}[/]", value)
    console.print(table)


@data_app.command("verify")
def verify_cmd(
    directory: Annotated[Path, typer.Argument(help="A prepared dataset directory.")],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check every shard's size and content hash against the manifest.

    Reads all data; exits 2 naming the first file that differs.
    """
    from tensoryard.data.dataset import verify_dataset

    with _bad_input_exits(), _progress("verify", quiet or as_json) as update:
        man = verify_dataset(directory, progress=update)
    if as_json:
        print_json({"ok": True, "dataset_id": man.dataset_id, "shards": man.num_shards})
        return
    console.print(f"ok: {man.num_shards} shards, {man.num_tokens:,} tokens match the manifest")


@data_app.command("import-megatron")
def import_megatron_cmd(
    prefixes: Annotated[
        list[str],
        typer.Argument(
            help="Megatron dataset prefixes (PREFIX.bin + PREFIX.idx).", show_default=False
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")],
    tokenizer: Annotated[
        str | None,
        typer.Option(help="The tokenizer the data was made with ('byte' or a tokenizer.json)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Make existing Megatron .bin/.idx data loadable (tokens are linked, not copied)."""
    from tensoryard.data.megatron import import_megatron

    with _bad_input_exits():
        man = import_megatron(prefixes, out, tokenizer=tokenizer)
    if as_json:
        print_json(man.as_dict())
        return
    console.print(
        f"imported: {out} — {man.num_tokens:,} tokens, {man.num_documents:,} sequences, "
        f"{man.num_shards} shards ({man.dtype})"
    )


def register(app: typer.Typer) -> None:
    """Add the `data` command group to the root `tyard` app."""
    app.add_typer(data_app, name="data")
