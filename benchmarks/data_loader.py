"""Training-data loaders side by side: tensoryard, litdata, mosaicml-streaming, HF datasets, memcpy.

One generated corpus of random uint16 tokens (>= 1 GB in full mode) is converted into each
loader's own format; every loader then reads shuffled batches of 8 sequences of 2048 tokens
(2049 stored tokens: inputs plus shifted targets) and is measured in a subprocess of its own
(its own venv, its own peak RSS):

* tokens/s with 0, 2, 4 and 8 DataLoader workers (the worker arms; memcpy only with 0 and 2),
  and the ratio of tensoryard to the best peer at each worker count,
* time to first batch (constructing the loader on a prepared dataset, imports excluded),
* resume latency: loading a state at 50% of an epoch into a fresh loader, to its first batch,
* peak RSS (ru_maxrss, which counts the page-cache pages a memory-mapped loader touched) and
  peak anonymous memory (what the loader allocated itself),
* time to first batch on one smaller corpus cut into 10 and into 10,000 shards.

The physical limit ("memcpy") is plain numpy gathering the same (8, 2049) windows at random
positions from the corpus held in RAM; the bulk copy bandwidth is reported next to it.

This 2-core machine is shared, so throughput is the best of 3 windows of 2 s in each process,
and the ratio to memcpy is the median over 7 pairs of alternating 1 s windows of tensoryard and
memcpy in one process (both then see the same load). Every dataset is read once before it is
measured, so all loaders start from the page cache.

Peers live in their own venvs under benchmarks/.venvs (see _data_peers.py); data lives under
benchmarks/.data. Both are reused by later runs. A full run writes its JSON under
benchmarks/results/ (committed) and this benchmark's row of benchmarks/RESULTS.md from it
(`--row-from-json` rebuilds the row from that file); --quick (a 4 Mi-token smoke run) does not
write the row. `--worker-arms` runs only the tokens/s arms (0, 2, 4 and 8 workers, every loader)
and writes its own row, data_loader_workers, from benchmarks/results/data_loader_workers.json.

    python benchmarks/data_loader.py
    python benchmarks/data_loader.py --worker-arms   # JSON: results/data_loader_workers.json
    python benchmarks/data_loader.py --json PATH --quick --only tensoryard,memcpy
"""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _data_peers  # noqa: E402
import _results  # noqa: E402

WORKER = HERE / "_data_worker.py"
DATA = HERE / ".data"
NAME = "data_loader"
ALL = ["tensoryard", "litdata", "streaming", "hf_datasets", "memcpy"]
PEERS = ["litdata", "streaming", "hf_datasets"]
WORKER_COUNTS = [0, 2, 4, 8]
VOCAB = 50304
console = Console(stderr=True)


# ---------------------------------------------------------------------------------------------
# sizes


def sizes(quick: bool) -> dict[str, Any]:
    """Corpus sizes and timings of a full or a quick run."""
    if quick:
        return {
            "tokens": 1 << 22,
            "shard_tokens_corpus": 1 << 22,
            "shards": 4,
            "by_shards": [10, 500],
            "seconds": 0.5,
            "trials": 1,
            "duel_seconds": 0.25,
            "duel_pairs": 2,
            "timeout_s": 300,
        }
    return {
        "tokens": 1 << 29,
        "shard_tokens_corpus": 1 << 26,
        "shards": 16,
        "by_shards": [10, 10_000],
        "seconds": 2.0,
        "trials": 3,
        "duel_seconds": 1.0,
        "duel_pairs": 7,
        "timeout_s": 900,
    }


# ---------------------------------------------------------------------------------------------
# corpus and conversions


def make_corpus(path: Path, tokens: int, seed: int) -> Path:
    """Random tokens in [0, VOCAB) as a raw uint16 file (reused when present)."""
    if path.exists() and path.stat().st_size == tokens * 2:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    rng = np.random.default_rng(seed)
    step = 1 << 24
    with open(tmp, "wb") as out, Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"corpus {path.name} ({tokens * 2 / 1e9:.2f} GB)", total=tokens)
        for lo in range(0, tokens, step):
            n = min(step, tokens - lo)
            rng.integers(0, VOCAB, size=n, dtype=np.uint16).tofile(out)
            bar.advance(task, n)
    os.replace(tmp, path)
    return path


def python_for(loader: str) -> Path:
    """The interpreter that runs `loader`: the project's for tensoryard/memcpy, else its venv."""
    if loader in PEERS:
        return _data_peers.PEERS[loader].python
    return Path(sys.executable)


_TMP: list[str] = []


def private_tmp() -> str:
    """This run's own temporary directory (removed at exit), the TMPDIR of every loader it
    starts: litdata and mosaicml-streaming put their default chunk directories and lock files
    in the system's temporary directory otherwise (``/tmp/chunks``, ``/tmp/000000_*``)."""
    if not _TMP:
        _TMP.append(tempfile.mkdtemp(prefix=f"tensoryard-{os.getuid()}-loaders-"))
        atexit.register(shutil.rmtree, _TMP[0], True)
    return _TMP[0]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env |= {
        "TMPDIR": private_tmp(),
        "HF_DATASETS_CACHE": str(DATA / "hf-cache"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    return env


def run_worker(loader: str, args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run _data_worker.py in `loader`'s interpreter; returns its RESULT or {"error": ...}."""
    cmd = [str(python_for(loader)), str(WORKER), *args]
    env = _env()
    if loader not in PEERS:
        # This checkout's tensoryard, not whichever copy the interpreter has installed.
        env["PYTHONPATH"] = str(HERE.parent / "src")
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=str(HERE)
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f}s: {' '.join(args[:3])}"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
    return {"error": f"exit {proc.returncode}: {tail}"}


def convert(loader: str, corpus: Path, out: Path, shards: int, timeout_s: float) -> Path:
    """The corpus in `loader`'s format at `out` (reused when a previous run completed it)."""
    if loader == "memcpy":
        return corpus
    stamp = out / ".tensoryard-bench-done"
    want = json.dumps({"corpus": corpus.name, "size": corpus.stat().st_size, "shards": shards})
    if stamp.exists() and stamp.read_text() == want:
        return out
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    got = run_worker(
        loader, ["convert", loader, str(corpus), str(out), "--shards", str(shards)], timeout_s
    )
    if "error" in got:
        raise RuntimeError(f"converting to {loader} failed: {got['error']}")
    stamp.write_text(want)
    console.log(
        f"converted {corpus.name} -> {loader} ({shards} shards) in {time.perf_counter() - t0:.1f}s"
    )
    return out


def warm(path: Path) -> None:
    """Read every file once so each loader starts from the page cache, like the others."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    buf = bytearray(8 << 20)
    for f in files:
        with open(f, "rb", buffering=0) as src:
            while src.readinto(buf):
                pass


def count_shards(loader: str, path: Path) -> int:
    """How many shard files a converted dataset has (the peers decide their own splits)."""
    patterns = {
        "tensoryard": "*.tok",
        "litdata": "*.bin",
        "streaming": "*.mds",
        "hf_datasets": "*.arrow",
    }
    return len(list(path.glob(patterns[loader])))


# ---------------------------------------------------------------------------------------------
# the run


def worker_task(workers: int) -> str:
    """The _data_worker.py task that measures tokens/s with `workers` DataLoader workers."""
    return "main" if workers == 0 else f"workers{workers}"


def measure_loader(
    loader: str, data: Path, cfg: dict[str, Any], *, arms_only: bool = False
) -> dict[str, Any]:
    """tokens/s (0, 2, 4 and 8 workers), time to first batch, resume at 50%, peak memory."""
    out: dict[str, Any] = {}
    warm(data)
    counts = [0, 2] if loader == "memcpy" else WORKER_COUNTS  # memcpy: the in-RAM reference
    tasks = [worker_task(n) for n in counts]
    if not arms_only and loader != "memcpy":
        tasks.append("resume")
    for task in tasks:
        got = run_worker(loader, _measure_args(loader, data, task, cfg), cfg["timeout_s"])
        out[task] = got
        if "error" in got:
            console.log(f"[red]{loader} {task}: {got['error']}")
        else:
            console.log(
                f"{loader} {task}: "
                + ", ".join(f"{k}={v:.4g}" for k, v in got.items() if isinstance(v, float))
            )
    return out


def _measure_args(loader: str, data: Path, task: str, cfg: dict[str, Any]) -> list[str]:
    trials = 1 if task == "resume" else cfg["trials"]
    return [
        "measure",
        loader,
        str(data),
        "--task",
        task,
        "--seconds",
        str(cfg["seconds"]),
        "--trials",
        str(trials),
    ]


def duel(data: dict[str, Path], cfg: dict[str, Any]) -> dict[str, Any]:
    """tensoryard against memcpy in one process, alternating windows: the ratio to the
    physical limit then compares runs made under the same load of this shared machine."""
    if not {"tensoryard", "memcpy"} <= set(data):
        return {}
    warm(data["tensoryard"])
    args = [
        "duel",
        str(data["tensoryard"]),
        str(data["memcpy"]),
        "--seconds",
        str(cfg["duel_seconds"]),
        "--pairs",
        str(cfg["duel_pairs"]),
    ]
    got = run_worker("tensoryard", args, cfg["timeout_s"])
    if "error" in got:
        console.log(f"[red]duel: {got['error']}")
    else:
        console.log(
            "tensoryard/memcpy per window pair: " + ", ".join(f"{x:.0%}" for x in got["ratios"])
        )
    return got


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg = sizes(args.quick)
    loaders = [x for x in (args.only.split(",") if args.only else ALL) if x]
    unknown = sorted(set(loaders) - set(ALL))
    if unknown:
        raise SystemExit(f"--only: unknown loader(s) {unknown}; choose from {ALL}")
    root = args.data_dir / ("quick" if args.quick else "full")
    notes: dict[str, str] = {}

    # 1. peer venvs (a peer that cannot be installed is reported and left out)
    for peer in [x for x in loaders if x in PEERS]:
        try:
            t0 = time.perf_counter()
            _data_peers.ensure_venv(peer)
            console.log(f"venv {peer} ready ({time.perf_counter() - t0:.1f}s)")
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            notes[peer] = f"not installable: {exc}"
            console.log(f"[red]{peer}: {notes[peer]}")
    loaders = [x for x in loaders if x not in notes]

    # 2. corpora and conversions
    corpus = make_corpus(root / "corpus.u16", cfg["tokens"], seed=1)
    small = make_corpus(root / "corpus-small.u16", cfg["shard_tokens_corpus"], seed=2)
    data: dict[str, Path] = {}
    for loader in loaders:
        try:
            data[loader] = convert(loader, corpus, root / loader, cfg["shards"], cfg["timeout_s"])
        except RuntimeError as exc:
            notes[loader] = str(exc)
            console.log(f"[red]{exc}")
    loaders = [x for x in loaders if x in data]

    # 3. the main measurements, one loader at a time
    raw: dict[str, Any] = {}
    for loader in loaders:
        raw[loader] = measure_loader(loader, data[loader], cfg, arms_only=args.worker_arms)
    if args.worker_arms:  # the worker arms only: no duel, resume or shard-count runs
        return summarize(raw, {}, {}, notes, cfg, loaders)
    raw["duel"] = duel(data, cfg)

    # 4. time to first batch against the number of shards (same small corpus)
    by_shards: dict[str, dict[str, float | str]] = {}
    shard_counts: dict[str, dict[str, int]] = {}
    for loader in [x for x in loaders if x in ("tensoryard", "litdata", "streaming")]:
        by_shards[loader], shard_counts[loader] = {}, {}
        for n in cfg["by_shards"]:
            try:
                path = convert(loader, small, root / f"{loader}-{n}", n, cfg["timeout_s"])
            except RuntimeError as exc:
                by_shards[loader][str(n)] = f"error: {exc}"
                continue
            warm(path)
            got = run_worker(
                loader, ["measure", loader, str(path), "--task", "ttfb"], cfg["timeout_s"]
            )
            by_shards[loader][str(n)] = got.get("ttfb_s", f"error: {got.get('error')}")
            shard_counts[loader][str(n)] = count_shards(loader, path)
            console.log(f"{loader} ttfb with {n} shards: {by_shards[loader][str(n)]}")
        if loader == "tensoryard":
            # The same loader on a dataset 8x smaller: peak memory must not depend on size.
            path = root / f"tensoryard-{cfg['by_shards'][0]}"
            got = run_worker(loader, _measure_args(loader, path, "main", cfg), cfg["timeout_s"])
            raw["tensoryard_small"] = got
    return summarize(raw, by_shards, shard_counts, notes, cfg, loaders)


# ---------------------------------------------------------------------------------------------
# summary, goals, RESULTS.md


def _pick(raw: dict[str, Any], task: str, key: str) -> dict[str, float | None]:
    return {name: raw[name].get(task, {}).get(key) for name in raw if name in ALL}


def summarize(
    raw: dict[str, Any],
    by_shards: dict[str, dict[str, float | str]],
    shard_counts: dict[str, dict[str, int]],
    notes: dict[str, str],
    cfg: dict[str, Any],
    loaders: list[str],
) -> dict[str, Any]:
    tps = _pick(raw, "main", "tokens_per_s")
    result: dict[str, Any] = {
        "tokens_per_s": tps,
        "tokens_per_s_2workers": _pick(raw, "workers2", "tokens_per_s"),
        "tokens_per_s_by_workers": {
            str(n): _pick(raw, worker_task(n), "tokens_per_s") for n in WORKER_COUNTS
        },
        "ttfb_s_by_workers": {str(n): _pick(raw, worker_task(n), "ttfb_s") for n in WORKER_COUNTS},
        "ttfb_s": _pick(raw, "main", "ttfb_s"),
        "resume_ms": _pick(raw, "resume", "resume_ms"),
        "peak_rss_mb": _pick(raw, "main", "peak_rss_mb"),
        "peak_anon_mb": _pick(raw, "main", "peak_anon_mb"),
        "ttfb_by_shards": by_shards,
        "duel_tensoryard_vs_memcpy": raw.get("duel", {}),
        "memcpy_bulk_tokens_per_s": raw.get("memcpy", {}).get("main", {}).get("bulk_tokens_per_s"),
        "config": {
            "corpus_tokens": cfg["tokens"],
            "corpus_bytes": cfg["tokens"] * 2,
            "seq_len": 2048,
            "global_batch": 8,
            "seconds_per_measurement": cfg["seconds"],
            "small_corpus_tokens": cfg["shard_tokens_corpus"],
            "loaders": loaders,
            "worker_counts": WORKER_COUNTS,
        },
        "notes": notes,
        "errors": {
            f"{n}.{t}": r["error"]
            for n, tasks in raw.items()
            if n in ALL
            for t, r in tasks.items()
            if "error" in r
        },
    }
    small = raw.get("tensoryard_small", {})
    if "tensoryard" in raw:
        result["peak_memory_by_dataset_size"] = {
            "tensoryard": {
                "full": {"tokens": cfg["tokens"], **_mem(raw["tensoryard"].get("main", {}))},
                "small": {"tokens": cfg["shard_tokens_corpus"], **_mem(small)},
            }
        }
    result["ratios"], result["goals"] = goals(result)
    return result


def _mem(r: dict[str, Any]) -> dict[str, Any]:
    return {"peak_rss_mb": r.get("peak_rss_mb"), "peak_anon_mb": r.get("peak_anon_mb")}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def goals(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ratios against the best peer and memcpy, and each goal as met / not met."""
    tps, tps2 = r["tokens_per_s"], r["tokens_per_s_2workers"]
    peers = {p: tps.get(p) for p in PEERS if tps.get(p)}
    best = max(peers, key=lambda p: peers[p]) if peers else None
    peers2 = {p: tps2.get(p) for p in PEERS if tps2.get(p)}
    best2 = max(peers2, key=lambda p: peers2[p]) if peers2 else None
    ty = tps.get("tensoryard")
    ratios = {
        "best_peer": best,
        "vs_best_peer": _ratio(ty, peers.get(best) if best else None),
        "vs_memcpy": _ratio(ty, tps.get("memcpy")),
        "best_peer_2workers": best2,
        "vs_best_peer_2workers": _ratio(
            tps2.get("tensoryard"), peers2.get(best2) if best2 else None
        ),
        "vs_memcpy_2workers": _ratio(tps2.get("tensoryard"), tps2.get("memcpy")),
        "vs_each_peer": {p: _ratio(ty, v) for p, v in peers.items()},
        # tensoryard / memcpy in alternating windows of one process; its median is the
        # ratio the goal is judged on (the separate runs above may see different loads)
        "vs_memcpy_separate_runs": _ratio(ty, tps.get("memcpy")),
        "vs_memcpy_window_pairs": r.get("duel_tensoryard_vs_memcpy", {}).get("ratios", []),
    }
    ratios["by_workers"] = by_workers(r)
    median = r.get("duel_tensoryard_vs_memcpy", {}).get("median_ratio")
    if median is not None:
        ratios["vs_memcpy"] = median
    shards = r["ttfb_by_shards"].get("tensoryard", {})
    ttfbs = [v for v in shards.values() if isinstance(v, float)]
    ttfb_ok = r["ttfb_s"].get("tensoryard")
    mem = r.get("peak_memory_by_dataset_size", {}).get("tensoryard", {})
    full_anon, small_anon = (
        mem.get("full", {}).get("peak_anon_mb"),
        mem.get("small", {}).get("peak_anon_mb"),
    )

    def met(ok: bool | None) -> str:
        return "n/a" if ok is None else ("met" if ok else "not met")

    g = {
        ">=3x best peer tokens/s": met(
            None if ratios["vs_best_peer"] is None else ratios["vs_best_peer"] >= 3
        ),
        ">=50% of memcpy": met(None if ratios["vs_memcpy"] is None else ratios["vs_memcpy"] >= 0.5),
        "ttfb <0.5s, flat in shard count": met(
            None
            if ttfb_ok is None or len(ttfbs) < 2
            else ttfb_ok < 0.5 and max(ttfbs) < 0.5 and ttfbs[-1] <= 2 * ttfbs[0] + 0.05
        ),
        "resume <50ms": met(
            None if r["resume_ms"].get("tensoryard") is None else r["resume_ms"]["tensoryard"] < 50
        ),
        ">=3x best peer at 0/2/4/8 workers": met(_all_at_least(ratios["by_workers"], 3.0)),
        "peak memory flat in dataset size": met(
            None if not (full_anon and small_anon) else full_anon <= 1.25 * small_anon + 16
        ),
    }
    return ratios, g


def by_workers(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per worker count: tensoryard's tokens/s, the best peer's, and their ratio."""
    out: dict[str, dict[str, Any]] = {}
    for n, tps in r.get("tokens_per_s_by_workers", {}).items():
        peers = {p: tps.get(p) for p in PEERS if tps.get(p)}
        best = max(peers, key=lambda p: peers[p]) if peers else None
        out[n] = {
            "tensoryard": tps.get("tensoryard"),
            "best_peer": best,
            "best_peer_tokens_per_s": peers.get(best) if best else None,
            "vs_best_peer": _ratio(tps.get("tensoryard"), peers.get(best) if best else None),
            "vs_each_peer": {p: _ratio(tps.get("tensoryard"), v) for p, v in peers.items()},
        }
    return out


def _all_at_least(arms: dict[str, dict[str, Any]], goal: float) -> bool | None:
    """Whether tensoryard reached `goal` x the best peer at every worker count (None: some
    count has no ratio)."""
    ratios = [a["vs_best_peer"] for a in arms.values()]
    if not ratios or any(x is None for x in ratios):
        return None
    return all(x >= goal for x in ratios)


def workers_cells(r: dict[str, Any]) -> str:
    """tensoryard vs the best peer at each worker count, for a RESULTS.md cell."""
    parts = []
    for n, a in r["ratios"].get("by_workers", {}).items():
        if a["vs_best_peer"]:
            parts.append(
                f"{n} workers: tensoryard {_fmt(a['tensoryard'])} vs {a['best_peer']} "
                f"{_fmt(a['best_peer_tokens_per_s'])} tok/s = {a['vs_best_peer']:.2f}x"
            )
        else:
            parts.append(f"{n} workers: tensoryard {_fmt(a['tensoryard'])} tok/s (no peer)")
    return "; ".join(parts)


def _fmt(x: float | None, scale: float = 1e6, unit: str = "M") -> str:
    return "n/a" if x is None else f"{x / scale:.1f}{unit}"


def warm_results_cells(r: dict[str, Any]) -> tuple[str, str, str]:
    """The RESULTS.md cells of a warm run, from its JSON."""
    tps, ratios, g = r["tokens_per_s"], r["ratios"], r["goals"]
    peers = ", ".join(f"{p} {_fmt(tps.get(p))}" for p in PEERS if tps.get(p))
    missing = ", ".join(f"{p}: {r['notes'][p]}" for p in PEERS if p in r["notes"])
    shards = r["ttfb_by_shards"].get("tensoryard", {})
    vs_peer = ratios["vs_best_peer"]
    vs_memcpy = ratios["vs_memcpy"]
    mem = r.get("peak_memory_by_dataset_size", {}).get("tensoryard", {})
    parts = [
        f"tensoryard {_fmt(tps.get('tensoryard'))} tok/s vs {peers or 'no peer'}"
        f" = {vs_peer:.2f}x best peer ({ratios['best_peer']})"
        if vs_peer
        else f"tensoryard {_fmt(tps.get('tensoryard'))} tok/s (no peer in this run)",
        f"{vs_memcpy:.0%} of the memcpy gather (median of alternating windows in one process; "
        f"separate runs: {_fmt(tps.get('memcpy'))} tok/s)"
        if vs_memcpy
        else "",
        workers_cells(r)
        if "by_workers" in ratios
        else f"2 workers: {_fmt(r['tokens_per_s_2workers'].get('tensoryard'))} tok/s",
        "ttfb "
        + "/".join(f"{v * 1000:.0f}ms@{k}" for k, v in shards.items() if isinstance(v, float))
        + " shards",
        f"resume {r['resume_ms'].get('tensoryard') or float('nan'):.1f}ms",
        "peak anon MB small/full "
        + "/".join(f"{mem.get(k, {}).get('peak_anon_mb') or 0:.0f}" for k in ("small", "full")),
        f"not installed: {missing}" if missing else "",
        "streaming runs beside a torchvision stub in its own venv" if tps.get("streaming") else "",
        f"load average at the end {r['load_average']}" if "load_average" in r else "",
    ]
    result = "; ".join(p for p in parts if p)
    goal = ">=3x best peer (0/2/4/8 workers); >=50% memcpy; ttfb<0.5s flat; resume<50ms; flat RSS"
    met = "; ".join(f"{k}: {v}" for k, v in g.items())
    return result, goal, met


def worker_arms_cells(r: dict[str, Any]) -> tuple[str, str, str]:
    """The RESULTS.md cells of a --worker-arms run, from its JSON."""
    counts = r["tokens_per_s_by_workers"]
    peers = [p for p in PEERS if any(counts[n].get(p) for n in counts)]
    each = "; ".join(
        f"{p} " + "/".join(_fmt(counts[n].get(p)) for n in counts) for p in ["tensoryard", *peers]
    )
    missing = ", ".join(f"{p}: {r['notes'][p]}" for p in PEERS if p in r["notes"])
    parts = [
        workers_cells(r),
        f"tok/s at {'/'.join(counts)} workers: {each}",
        f"not installed: {missing}" if missing else "",
        "streaming runs beside a torchvision stub in its own venv" if "streaming" in peers else "",
        f"load average at the end {r['load_average']}" if "load_average" in r else "",
    ]
    arms = r["ratios"]["by_workers"]
    met = "; ".join(
        f"{n} workers: "
        + ("n/a" if a["vs_best_peer"] is None else "met" if a["vs_best_peer"] >= 3 else "not met")
        for n, a in arms.items()
    )
    text = "; ".join(p for p in parts if p)
    return text, ">=3x the best peer's tok/s at 0, 2, 4 and 8 DataLoader workers", met


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--json",
        type=Path,
        help="the run's JSON (default benchmarks/results/data_loader[_cold].json, committed)",
    )
    parser.add_argument("--quick", action="store_true", help="small smoke run (4 Mi tokens)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(ALL)}")
    parser.add_argument(
        "--data-dir", type=Path, default=DATA, help="generated corpora and converted datasets"
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="instead: the cold first epoch from S3 (moto), HDFS and JuiceFS (_data_cold.py)",
    )
    parser.add_argument("--ranks", type=int, default=8, help="--cold: ranks on the node")
    parser.add_argument("--workers", type=int, default=2, help="--cold: DataLoader workers/rank")
    parser.add_argument("--cold-mb", type=int, default=64, help="--cold: dataset size in MB")
    parser.add_argument(
        "--reps",
        type=int,
        default=3,
        help="--cold: runs of every arm, interleaved; the row reports the median run and the "
        "worst (default 3)",
    )
    parser.add_argument(
        "--cold-backends",
        default="s3,hdfs,juicefs",
        help="--cold: the backends to run, of s3,hdfs,juicefs (S3 always runs: the peers read "
        "it); a subset writes its own row, e.g. data_loader_cold_s3_hdfs",
    )
    parser.add_argument(
        "--worker-arms",
        action="store_true",
        help="only tokens/s with 0, 2, 4 and 8 workers per loader (row data_loader_workers)",
    )
    parser.add_argument("--no-results-line", action="store_true", help="leave RESULTS.md alone")
    parser.add_argument(
        "--row-from-json",
        action="store_true",
        help="measure nothing: write the RESULTS.md row from the JSON file of an earlier run",
    )
    args = parser.parse_args()
    name = "data_loader_cold" if args.cold else NAME
    if args.cold:
        chosen = {b.strip() for b in args.cold_backends.split(",") if b.strip()} | {"s3"}
        if not chosen <= set(COLD_BACKENDS):
            parser.error(f"--cold-backends: choose from {','.join(COLD_BACKENDS)}")
        args.cold_backends = [b for b in COLD_BACKENDS if b in chosen]
        if len(chosen) < len(COLD_BACKENDS):
            name += "_" + "_".join(args.cold_backends)
        if (args.ranks, args.workers, args.cold_mb) != (8, 2, 64):  # its own row and JSON
            name += f"_{args.ranks}x{args.workers}_{args.cold_mb}mb"
    name = "data_loader_workers" if args.worker_arms else name
    args.json = args.json or HERE / "results" / f"{name}.json"
    if args.row_from_json:
        result = json.loads(args.json.read_text())
    else:
        result = cold_run(args) if args.cold else warm_run(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.quick or args.no_results_line:
        return
    cells = warm_results_cells
    cells = cold_results_cells if args.cold else cells
    cells = worker_arms_cells if args.worker_arms else cells
    text, goal, met = cells(result)
    day = str(result.get("date", ""))[:10] or None
    _results.write_results_line(name, result["command"], text, goal, met, date=day)


def warm_run(args: argparse.Namespace) -> dict[str, Any]:
    """Every loader from the page cache; the JSON of the run."""
    t0 = time.perf_counter()
    result = run(args)
    result["wall_s"] = time.perf_counter() - t0
    console.print_json(json.dumps({k: result[k] for k in ("tokens_per_s", "ratios", "goals")}))
    if args.data_dir != DATA:  # the command names no path of this machine
        sys.argv = [a if a != str(args.data_dir) else "DIR" for a in sys.argv]
    return {**_results.provenance("data_loader.py"), **result}


# ---------------------------------------------------------------------------------------------
# --cold: remote backends


def cold_run(args: argparse.Namespace) -> dict[str, Any]:
    """Every cold-start arm; the JSON of the run."""
    import _data_cold

    cfg = {
        "megabytes": 8 if args.quick else args.cold_mb,
        "shard_mb": 2 if args.quick else 8,
        "ranks": 2 if args.quick else args.ranks,
        "workers": args.workers,
        "seq_len": 2048,
        "global_batch": 8 * (2 if args.quick else args.ranks),
        "nodes": 5 if args.quick else 125,
        "timeout_s": 600,
        "backends": args.cold_backends,
        "reps": 1 if args.quick else args.reps,
    }
    t0 = time.perf_counter()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("cold start", total=8)

        def step(name: str) -> None:
            bar.update(task, advance=1, description=f"cold start: {name}")

        result = _data_cold.run_cold(cfg, progress=step)
    subset = args.cold_backends != list(COLD_BACKENDS)
    command = f"python benchmarks/data_loader.py --cold --json benchmarks/results/{args.json.name}"
    if subset:
        command += f" --cold-backends {','.join(args.cold_backends)}"
    if (args.ranks, args.workers, args.cold_mb) != (8, 2, 64):
        command += f" --ranks {args.ranks} --workers {args.workers} --cold-mb {args.cold_mb}"
    if args.reps != 3:
        command += f" --reps {args.reps}"
    result |= {
        "wall_s": time.perf_counter() - t0,
        "command": command + (" --quick" if args.quick else ""),
        "commit": _git_commit(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": _machine(),
    }
    console.print_json(json.dumps(result["arms"]))
    return result


COLD_BACKENDS = ("s3", "hdfs", "juicefs")
# Arms of a second client for a backend: measured to choose the default client (docs/data.md,
# "HDFS: why hdfs-native"), reported, and left out of the goals, which hold for the defaults.
COMPARISON_CLIENTS = ("hdfs (webhdfs)",)


def cold_results_cells(r: dict[str, Any]) -> tuple[str, str, str]:
    """The RESULTS.md cells of a cold-start run, from its JSON."""
    arms, cfg, idx = r["arms"], r["config"], r["thousand_rank_start"]
    # Runs before 2026-12-07 had the service on by default and a "no fetch service" arm; later
    # runs read S3 (static keys) without it by default and force it in a comparison arm.
    old_style = "s3 (moto), no fetch service" in arms
    default = arms.get("s3 (moto)", {}).get("tokens_per_s")
    other = arms.get(
        "s3 (moto), no fetch service" if old_style else "s3 (moto), through the fetch service",
        {},
    ).get("tokens_per_s")
    with_service, no_service = (default, other) if old_style else (other, default)
    local = arms["local (page cache)"]["tokens_per_s"]
    peer_names = ("litdata", "streaming")
    parts = []
    for name, a in arms.items():
        if "error" in a:
            parts.append(f"{name} failed: {a['error'][:200]}")
            continue
        ratio = a["fetched_over_needed"]
        fetched = "" if ratio is None else f", fetched/needed {ratio:.2f}"
        if a.get("file_reads") is not None:
            fetched += f", {a['file_reads']} reads"
        worst = a.get("first_batch_s_max_worst")
        parts.append(
            f"{name} {a['tokens_per_s'] / 1e6:.1f}M tok/s "
            f"({a['tokens_per_s'] / local:.2f}x local), "
            f"first batch {a['first_batch_s_max']:.2f}s"
            + ("" if worst is None else f" (worst run {worst:.2f}s)")
            + fetched
        )
    goal = r.get("goal") or {}
    vs_peer = (
        f"tensoryard s3 / best peer ({goal['best_peer']}) cold tokens/s = {goal['ratio']:.2f}x"
        if goal.get("ratio") is not None
        else "no peer arm completed"
    )
    reps = int(cfg.get("reps", 1))
    text = (
        f"{cfg['ranks']} ranks x {cfg['workers']} workers, {cfg['megabytes']} MB"
        + (
            f", {reps} runs of every arm (interleaved; median run, first batch of the slowest rank)"
            if reps > 1
            else ""
        )
        + ": "
        + "; ".join(parts)
        + f"; {vs_peer}"
        + (
            f"; s3 with / without the node fetch service = {with_service / no_service:.2f}x"
            if with_service and no_service
            else ""
        )
        + "; peers read S3 only (neither has an HDFS or JuiceFS mode here; their "
        "fetched bytes are their cache directory's size)"
    )
    left_out = [b for b in COLD_BACKENDS if b not in cfg.get("backends", COLD_BACKENDS)]
    if left_out:
        text += f"; not run: {', '.join(left_out)}" + ("" if idx else ", the 1,000-rank start")
    if idx is not None:
        text += (
            f"; {idx['ranks']}-rank start on {idx['nodes']} nodes: "
            f"{idx['per_node']['metadata_reads']} metadata reads "
            f"({idx['per_node']['per_node']:.0f}/node) "
            f"vs {idx['per_rank']['metadata_reads']} when each rank fetches its own"
        )
    remote = {
        k: a
        for k, a in arms.items()
        if not k.startswith(peer_names)
        and "no fetch service" not in k  # the comparison arms, not the default
        and "through the fetch service" not in k
        and k not in COMPARISON_CLIENTS
        and a.get("fetched_over_needed") is not None
    }
    once = all(abs(a["fetched_over_needed"] - 1.0) < 1e-9 for a in remote.values())
    fast = [k for k, a in remote.items() if a["first_batch_s_max"] < 1.0]
    slow = [f"{k} {a['first_batch_s_max']:.2f}s" for k, a in remote.items() if k not in fast]
    every = [t for a in remote.values() for t in a.get("first_batch_s_max_runs", [])]
    ratio = goal.get("ratio")
    met = (
        f"each byte once per node: {'met' if once else 'not met'}; "
        f"first batch <1s: {'met' if len(fast) == len(remote) else 'not met'} "
        f"(under 1 s: {len(fast)} of {len(remote)} backends"
        + (f"; over: {', '.join(slow)}" if slow else "")
        + (f"; runs under 1 s: {sum(t < 1.0 for t in every)} of {len(every)}" if reps > 1 else "")
        + ")"
        + "".join(
            f"; {k} (the HDFS client not chosen, for comparison) "
            f"{arms[k]['first_batch_s_max']:.2f}s"
            for k in COMPARISON_CLIENTS
            if "first_batch_s_max" in arms.get(k, {})
        )
        + "; "
        ">=2x best peer cold tokens/s: "
        + ("not measured" if ratio is None else ("met" if ratio >= 2 else "not met"))
    )
    return text, "bytes fetched = dataset; first batch <1s; >=2x best peer cold", met


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _machine() -> str:
    import platform

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {mem:.0f} GiB, {platform.platform()}"


if __name__ == "__main__":
    main()
