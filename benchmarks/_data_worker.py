"""One measurement (or one format conversion) of one loader, run in that loader's own venv.

Invoked by `benchmarks/data_loader.py` as a subprocess so that each loader's peak RSS is its
own and its dependencies stay in its venv. Only the standard library and numpy are imported at
the top; each loader's library is imported inside its functions. Prints one JSON line.

    python _data_worker.py convert LOADER CORPUS OUT --shards N
    python _data_worker.py measure LOADER DATA --task main|workersN|resume|ttfb --seconds S
    python _data_worker.py duel TENSORYARD_DIR CORPUS --seconds S --pairs N
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

SEQ_LEN = 2048
SAMPLE = SEQ_LEN + 1  # inputs + shifted targets
BATCH = 8
VOCAB = 50304
SEED = 0


# ---------------------------------------------------------------------------------------------
# memory


class RssSampler:
    """Peak resident and anonymous (private) memory of this process, sampled every 10 ms.

    ``ru_maxrss`` counts file pages a loader maps (page cache), so it grows with how much of
    a memory-mapped dataset was touched; RssAnon is the memory the loader itself allocated.
    """

    def __init__(self) -> None:
        self.peak_anon_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        self.peak_anon_kb = max(self.peak_anon_kb, int(line.split()[1]))
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self._sample()

    def result(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self._sample()
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"peak_rss_mb": peak_kb / 1024, "peak_anon_mb": self.peak_anon_kb / 1024}


# ---------------------------------------------------------------------------------------------
# conversions: the same token stream in each loader's format


def _corpus(path: str) -> np.ndarray:
    return np.memmap(path, dtype=np.uint16, mode="r")


def _pieces(n: int, parts: int) -> list[tuple[int, int]]:
    step = math.ceil(n / parts)
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def convert_tensoryard(corpus: str, out: str, shards: int) -> None:
    from tensoryard.data import write_token_dataset

    tokens = _corpus(corpus)
    per_shard = math.ceil(len(tokens) / shards)
    chunks = (np.asarray(tokens[lo:hi]) for lo, hi in _pieces(len(tokens), 64))
    write_token_dataset(out, chunks, vocab_size=VOCAB, eos_id=None, shard_tokens=per_shard)


def _litdata_item(span: tuple[str, int, int]) -> Iterator[Any]:
    import torch

    path, lo, hi = span
    yield torch.from_numpy(np.array(_corpus(path)[lo:hi]))


def convert_litdata(corpus: str, out: str, shards: int) -> None:
    from litdata import TokensLoader, optimize

    n = len(_corpus(corpus))
    # One input item per chunk, each exactly a chunk's worth of tokens.
    pieces = _pieces(n, shards)
    inputs = [(corpus, lo, hi) for lo, hi in pieces]
    optimize(
        fn=_litdata_item,
        inputs=inputs,
        output_dir=out,
        chunk_size=pieces[0][1] - pieces[0][0],
        item_loader=TokensLoader(),
        num_workers=1,
        mode="overwrite",
    )


def convert_streaming(corpus: str, out: str, shards: int) -> None:
    from streaming import MDSWriter

    tokens = _corpus(corpus)
    samples = len(tokens) // SAMPLE
    sample_bytes = SAMPLE * 2 + 16  # payload plus MDS per-sample framing
    limit = max(sample_bytes * 2, math.ceil(samples / shards) * sample_bytes)
    columns = {"tokens": f"ndarray:uint16:{SAMPLE}"}
    with MDSWriter(out=out, columns=columns, size_limit=limit, compression=None) as w:
        for i in range(samples):
            w.write({"tokens": np.asarray(tokens[i * SAMPLE : (i + 1) * SAMPLE])})


def convert_hf_datasets(corpus: str, out: str, shards: int) -> None:
    import pyarrow as pa
    from datasets import Dataset
    from datasets.table import InMemoryTable

    tokens = _corpus(corpus)
    samples = len(tokens) // SAMPLE
    # Build the fixed-size list column with pyarrow: from_dict on a 2-D numpy array can exhaust
    # memory (ENVIRONMENT.md).
    flat = pa.array(np.asarray(tokens[: samples * SAMPLE]), type=pa.uint16())
    column = pa.FixedSizeListArray.from_arrays(flat, SAMPLE)
    table = pa.table({"tokens": column})
    Dataset(InMemoryTable(table)).save_to_disk(out, num_shards=shards)


CONVERTERS: dict[str, Callable[[str, str, int], None]] = {
    "tensoryard": convert_tensoryard,
    "litdata": convert_litdata,
    "streaming": convert_streaming,
    "hf_datasets": convert_hf_datasets,
}


# ---------------------------------------------------------------------------------------------
# loaders: each returns (batches, resume) where resume(fraction) builds a fresh loader, and
# returns a zero-argument function that loads a state at `fraction` of an epoch and yields the
# first batch (the part that is timed)


Loader = tuple[Iterable[Any], Callable[[float], Callable[[], Any]]]


def loader_tensoryard(data: str, workers: int) -> Loader:
    from tensoryard.data import build_loader
    from tensoryard.data.torch_loader import TorchTokenLoader

    def make() -> TorchTokenLoader:
        inner = build_loader(data, seq_len=SEQ_LEN, global_batch=BATCH, seed=SEED)
        # dtype=None hands out the stored uint16 tokens, like every peer here.
        return TorchTokenLoader(inner, num_workers=workers, dtype=None)

    def resume(fraction: float) -> Callable[[], Any]:
        fresh = make()
        state = fresh.state_dict()
        per_epoch = fresh.loader.samples_per_epoch
        state["consumed_samples"] = int(per_epoch * fraction) // BATCH * BATCH
        return lambda: (fresh.load_state_dict(state), next(iter(fresh)))[1]

    return make(), resume


def loader_litdata(data: str, workers: int) -> Loader:
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    def make() -> Any:
        ds = StreamingDataset(
            data,
            item_loader=TokensLoader(block_size=SAMPLE),
            shuffle=True,
            drop_last=True,
            seed=SEED,
        )
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)

    def resume(fraction: float) -> Callable[[], Any]:
        probe = make()
        next(iter(probe))
        state = probe.state_dict()
        half = int(len(probe.dataset) * fraction) // BATCH * BATCH
        state["num_samples_yielded"] = half
        state["dataset"]["num_samples_yielded"] = half
        state["dataset"]["sample_in_epoch"] = half
        fresh = make()
        return lambda: (fresh.load_state_dict(state), next(iter(fresh)))[1]

    return make(), resume


def loader_streaming(data: str, workers: int) -> Loader:
    from streaming import StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()

    def make() -> Any:
        ds = StreamingDataset(local=data, shuffle=True, shuffle_seed=SEED, batch_size=BATCH)
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)

    def resume(fraction: float) -> Callable[[], Any]:
        fresh = make()
        half = int(fresh.dataset.num_samples * fraction) // BATCH * BATCH
        state = fresh.dataset.state_dict(num_samples=half, from_beginning=True)
        return lambda: (fresh.load_state_dict(state), next(iter(fresh)))[1]

    return make(), resume


def loader_hf_datasets(data: str, workers: int) -> Loader:
    import torch
    from datasets import load_from_disk
    from torch.utils.data import DataLoader

    class Batches(torch.utils.data.Dataset[Any]):
        """Batch b = rows [8b, 8b + 8) of the shuffled dataset, fetched in one call."""

        def __init__(self, rows: Any) -> None:
            self.rows = rows

        def __len__(self) -> int:
            return len(self.rows) // BATCH

        def __getitem__(self, b: int) -> Any:
            return torch.from_numpy(self.rows[b * BATCH : (b + 1) * BATCH]["tokens"])

    def make(start: int = 0) -> Any:
        rows = load_from_disk(data).with_format("numpy").shuffle(seed=SEED, keep_in_memory=True)
        batches = Batches(rows)
        return DataLoader(
            batches, batch_size=None, sampler=range(start, len(batches)), num_workers=workers
        )

    def resume(fraction: float) -> Callable[[], Any]:
        # A map-style dataset resumes by starting its sampler at the saved batch.
        rows = load_from_disk(data).with_format("numpy").shuffle(seed=SEED, keep_in_memory=True)
        batches = Batches(rows)
        start = int(len(batches) * fraction)
        return lambda: next(
            iter(DataLoader(batches, batch_size=None, sampler=range(start, len(batches))))
        )

    return make(), resume


def loader_memcpy(data: str, workers: int) -> Loader:
    """The physical limit: the same (8, 2049) windows gathered with numpy from RAM."""
    tokens = np.fromfile(data, dtype=np.uint16)  # the whole corpus in anonymous memory
    n = (len(tokens) - 1) // SEQ_LEN

    def gather(seed: int) -> Iterator[np.ndarray]:
        rng = np.random.default_rng(seed)
        while True:
            starts = rng.integers(0, n, size=(64, BATCH)) * SEQ_LEN
            for row in starts:
                out = np.empty((BATCH, SAMPLE), dtype=np.uint16)
                for j, s in enumerate(row.tolist()):
                    out[j] = tokens[s : s + SAMPLE]
                yield out

    if workers == 0:
        return gather(SEED), lambda fraction: lambda: next(gather(SEED))

    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class Gather(IterableDataset[Any]):
        def __iter__(self) -> Iterator[Any]:
            info = get_worker_info()
            for arr in gather(SEED + (info.id if info else 0)):
                yield torch.from_numpy(arr)

    return DataLoader(Gather(), batch_size=None, num_workers=workers), lambda f: lambda: None


LOADERS: dict[str, Callable[[str, int], Loader]] = {
    "tensoryard": loader_tensoryard,
    "litdata": loader_litdata,
    "streaming": loader_streaming,
    "hf_datasets": loader_hf_datasets,
    "memcpy": loader_memcpy,
}


# ---------------------------------------------------------------------------------------------
# measurements


def _tokens_of(batch: Any) -> int:
    arr = batch["tokens"] if isinstance(batch, dict) else batch
    rows = int(arr.shape[0])
    return rows * SEQ_LEN  # tokens a model trains on per batch, the same unit for every loader


# Imported before the clock starts: time to first batch measures the loader, not the import of
# torch (several seconds on a busy 2-core machine).
IMPORTS: dict[str, list[str]] = {
    "tensoryard": ["torch", "tensoryard.data", "tensoryard.data.torch_loader"],
    "litdata": ["torch", "litdata"],
    "streaming": ["torch", "streaming", "streaming.base.util"],
    "hf_datasets": ["torch", "datasets", "torch.utils.data"],
    "memcpy": ["torch", "torch.utils.data"],
}


def measure(loader: str, data: str, task: str, seconds: float, trials: int = 1) -> dict[str, Any]:
    import importlib

    t_import = time.perf_counter()
    for module in IMPORTS[loader]:
        importlib.import_module(module)
    sampler = RssSampler()
    workers = int(task.removeprefix("workers")) if task.startswith("workers") else 0
    t0 = time.perf_counter()
    batches, resume = LOADERS[loader](data, workers)
    result: dict[str, Any] = {"loader": loader, "task": task, "import_s": t0 - t_import}
    if task == "resume":
        timed = resume(0.5)
        t1 = time.perf_counter()
        batch = timed()
        result["resume_ms"] = (time.perf_counter() - t1) * 1000
        result["resume_batch_shape"] = list(_shape(batch))
        return result | sampler.result()
    it = iter(batches)
    first = next(it)
    result["ttfb_s"] = time.perf_counter() - t0
    result["batch_shape"] = list(_shape(first))
    if task == "ttfb":
        return result | sampler.result()
    # Several windows, best one reported: this 2-core machine is shared, and a window that
    # another process's burst slowed down says nothing about the loader.
    state = {"it": it, "epochs": 0}
    windows = [_window(batches, state, seconds) for _ in range(trials)]
    best = max(windows, key=lambda w: w["tokens_per_s"])
    result |= best
    result["tokens_per_s_windows"] = [w["tokens_per_s"] for w in windows]
    result["epoch_restarts"] = state["epochs"]
    result |= sampler.result()
    if loader == "memcpy" and task == "main":
        result["bulk_tokens_per_s"] = bulk_copy_rate(data)
    return result


def bulk_copy_rate(path: str, repeats: int = 4) -> float:
    """Tokens/s of one large numpy copy in RAM (memory bandwidth, no per-batch work)."""
    src = np.fromfile(path, dtype=np.uint16, count=1 << 27)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the destination pages in first
    t0 = time.perf_counter()
    for _ in range(repeats):
        np.copyto(dst, src)
    return repeats * len(src) / (time.perf_counter() - t0)


def duel(data: str, corpus: str, seconds: float, pairs: int) -> dict[str, Any]:
    """tensoryard and the memcpy gather in one process, alternating short windows, so each
    tensoryard/memcpy ratio compares two windows a second apart under the same machine load."""
    import importlib

    for module in IMPORTS["tensoryard"]:
        importlib.import_module(module)
    ty, _ = loader_tensoryard(data, 0)
    mc, _ = loader_memcpy(corpus, 0)
    states = {"tensoryard": {"it": iter(ty), "epochs": 0}, "memcpy": {"it": iter(mc), "epochs": 0}}
    _window(ty, states["tensoryard"], seconds)  # warm-up windows, not counted
    _window(mc, states["memcpy"], seconds)
    rates: dict[str, list[float]] = {"tensoryard": [], "memcpy": []}
    for _ in range(pairs):
        for name, batches in (("tensoryard", ty), ("memcpy", mc)):
            rates[name].append(_window(batches, states[name], seconds)["tokens_per_s"])
    ratios = [a / b for a, b in zip(rates["tensoryard"], rates["memcpy"], strict=True)]
    return {"task": "duel", "rates": rates, "ratios": ratios, "median_ratio": _median(ratios)}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _window(batches: Iterable[Any], state: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Consume batches for `seconds`; finite loaders restart their epoch (that cost counts)."""
    tokens, count = 0, 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        try:
            batch = next(state["it"])
        except StopIteration:
            state["epochs"] += 1
            state["it"] = iter(batches)
            continue
        tokens += _tokens_of(batch)
        count += 1
        if count % 16 == 0 and time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": tokens / elapsed, "batches": count, "seconds": elapsed}


def _shape(batch: Any) -> tuple[int, ...]:
    arr = batch["tokens"] if isinstance(batch, dict) else batch
    return tuple(int(x) for x in arr.shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    conv = sub.add_parser("convert")
    conv.add_argument("loader", choices=sorted(CONVERTERS))
    conv.add_argument("corpus")
    conv.add_argument("out")
    conv.add_argument("--shards", type=int, required=True)
    meas = sub.add_parser("measure")
    meas.add_argument("loader", choices=sorted(LOADERS))
    meas.add_argument("data")
    meas.add_argument(
        "--task",
        choices=["main", "workers2", "workers4", "workers8", "resume", "ttfb"],
        required=True,
    )
    both = sub.add_parser("duel", help="tensoryard vs memcpy, alternating in one process")
    both.add_argument("data", help="tensoryard dataset directory")
    both.add_argument("corpus", help="the raw corpus file")
    both.add_argument("--seconds", type=float, default=1.0)
    both.add_argument("--pairs", type=int, default=5)
    meas.add_argument("--seconds", type=float, default=3.0, help="length of one window")
    meas.add_argument("--trials", type=int, default=1, help="windows; the best is reported")
    args = parser.parse_args()
    if args.cmd == "convert":
        t0 = time.perf_counter()
        CONVERTERS[args.loader](args.corpus, args.out, args.shards)
        out = {"converted": args.loader, "seconds": time.perf_counter() - t0}
    elif args.cmd == "duel":
        out = duel(args.data, args.corpus, args.seconds, args.pairs)
    else:
        out = measure(args.loader, args.data, args.task, args.seconds, args.trials)
    sys.stdout.flush()
    print("RESULT " + json.dumps(out), flush=True)
    # Some peers leave non-daemon threads behind; the measurement is complete.
    os._exit(0)


if __name__ == "__main__":
    main()
