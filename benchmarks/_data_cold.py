"""Cold start from remote storage (``data_loader.py --cold``): every backend in one run.

One prepared dataset of random uint16 tokens (64 MB by default, 8 MB shards) is uploaded to
S3 (moto_server), HDFS (a MiniDFSCluster, read through hdfs-native and through WebHDFS) and
JuiceFS (its S3 gateway), all started here through scripts/storage-testenv. For each backend
``ranks`` processes on one node (one shared, empty node-local cache directory) each read their
share of one epoch with ``workers`` DataLoader workers. Reported per backend: aggregate tokens/s
(all tokens over the slowest rank's wall time, from process start), time to first batch (the
slowest rank), bytes fetched from the backend over the bytes the epoch needs (metadata plus
every token shard: 1.0 means each byte crossed the network once for the node), file reads
(GETs / HDFS opens), and peak RSS of a rank and of its workers. The same ranks read the same
dataset from a local directory (page cache) as the reference.

Then a 1,000-rank start against HDFS: 125 nodes x 8 ranks open the dataset (manifest, index,
listing), once with the node-wide metadata cache and once with every rank fetching its own.

Every arm runs ``reps`` times (``--reps``, 3 by default), interleaved (every arm once, then
again), each run with an empty cache and a fresh fetch service; an arm reports its median run
and its worst. One run per arm, as before, left the first batch to chance: over six
runs of the HDFS arm alone on this machine its slowest rank took 0.46-0.96 s, and single runs
of the benchmark gave 0.65, 1.06 and 1.08 s.

The tensoryard arms run with the defaults: the node fetch service (``tensoryard.data.fetchd``)
serves HDFS and the fsspec stores, and S3 with static keys is read by every process over the
standard-library client; the arm ``s3 (moto), through the fetch service`` repeats the S3 arm
with the service forced on (``TYARD_DATA_FETCH_SERVICE=1``), to show what it changes.
``--cold-backends s3,hdfs`` (or ``s3``) leaves JuiceFS (and HDFS with its 1,000-rank start)
out, for a machine where they are not built; S3 (moto) always runs, the peers need it.

Warm-up: after the upload, one 1-byte ranged read of every file on each backend (not through
any arm's cache; over hdfs-native and WebHDFS both) loads the servers' code paths before the
first arm. Without it, in two runs the
first S3 arm was the slower of the two S3 arms whichever client it used (2.49 s and 2.00 s to the
first batch against 0.80 s and 1.27 s for the second).

Peers' remote modes run against the same moto server in the same run: the same tokens are
converted to litdata's and mosaicml-streaming's formats (``_data_worker.py convert``, 8 chunks /
shards like ours), uploaded to the bucket, and read by ``ranks`` processes with ``workers``
DataLoader workers each (``_data_cold_peer.py``, in light venvs from ``_data_peers.py``), each
library with one node-local cache directory shared by the ranks, as it documents. Their "bytes
fetched" is what their cache directory holds after the epoch (neither reports its downloads;
neither deletes chunks under its default cache limit at this size), and their GET counts are
not known. Neither reads HDFS or a JuiceFS S3 gateway differently from S3, so they run on S3
only.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
RANK = HERE / "_data_cold_rank.py"
ROOT = HERE.parent
TESTENV = ROOT / "scripts" / "storage-testenv"
BUCKET = "tyard-bench"
PREFIX = "corpus"
ALL_BACKENDS = frozenset({"s3", "hdfs", "juicefs"})
CREDS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret"}


def _free_port(start: int) -> int:
    for port in range(start, 27400):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in the benchmark's range")


def _wait_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


@contextlib.contextmanager
def backends(work: Path, which: frozenset[str] = ALL_BACKENDS) -> Iterator[dict[str, str]]:
    """moto_server plus storage-testenv's HDFS and JuiceFS (those of them in ``which``); yields
    their addresses."""
    testenv = sorted(which - {"s3"})
    moto_port = _free_port(27380)
    moto = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("moto_server")),
            "-H",
            "127.0.0.1",
            "-p",
            str(moto_port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env_dir = work / "storage-env"
    env = os.environ | {"TYARD_STORAGE_PORT_BASE": str(_free_port(27370))}
    try:
        _wait_port(moto_port)
        values: dict[str, str] = {}
        if testenv:
            up = [str(TESTENV), "up", "--dir", str(env_dir), *(testenv if len(testenv) < 2 else [])]
            subprocess.run(up, env=env, check=True)
            lines = (env_dir / "env").read_text().splitlines()
            values = dict(line.split("=", 1) for line in lines if line)
        values["MOTO_ENDPOINT"] = f"http://127.0.0.1:{moto_port}"
        yield values
    finally:
        if testenv:
            subprocess.run([str(TESTENV), "down", "--dir", str(env_dir)], check=False)
        moto.terminate()
        moto.wait(timeout=10)


def make_dataset(out: Path, megabytes: int, shard_mb: int) -> Path:
    """The prepared dataset at ``out``; the same tokens raw at ``out``.u16 (for the peers)."""
    from tensoryard.data import write_token_dataset

    tokens = megabytes * (1 << 20) // 2
    rng = np.random.default_rng(0)
    data = rng.integers(0, 50304, size=tokens, dtype=np.uint16)
    data.tofile(out.with_suffix(".u16"))
    write_token_dataset(
        out, [data], vocab_size=50304, eos_id=None, shard_tokens=shard_mb * (1 << 20) // 2
    )
    return out


def upload(
    dataset: Path, env: dict[str, str], which: frozenset[str] = ALL_BACKENDS
) -> dict[str, tuple[str, dict[str, Any]]]:
    """Put the dataset on every backend of ``which``; backend name -> (URL, storage options)."""
    import boto3

    files = sorted(p for p in dataset.iterdir() if p.is_file())
    urls: dict[str, tuple[str, dict[str, Any]]] = {}
    stores = [
        (
            "s3 (moto)",
            env["MOTO_ENDPOINT"],
            BUCKET,
            CREDS["AWS_ACCESS_KEY_ID"],
            CREDS["AWS_SECRET_ACCESS_KEY"],
        )
    ]
    if "juicefs" in which:
        stores.append(
            (
                "juicefs (S3 gateway)",
                env["TYARD_JUICEFS_S3_ENDPOINT"],
                env["TYARD_JUICEFS_S3_BUCKET"],
                env["TYARD_JUICEFS_S3_ACCESS_KEY"],
                env["TYARD_JUICEFS_S3_SECRET_KEY"],
            )
        )
    for name, endpoint, bucket, key, secret in stores:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name="us-east-1",
        )
        if name.startswith("s3"):
            client.create_bucket(Bucket=bucket)
        for f in files:
            client.upload_file(str(f), bucket, f"{PREFIX}/{f.name}")
        for f in (f for f in files if f.stat().st_size):  # warm-up (module doc); uncached
            client.get_object(Bucket=bucket, Key=f"{PREFIX}/{f.name}", Range="bytes=0-0")[
                "Body"
            ].read()
        urls[name] = (
            f"s3://{bucket}/{PREFIX}",
            {"endpoint_url": endpoint, "_creds": [key, secret]},
        )
    if "hdfs" not in which:
        return urls
    import hdfs_native

    hdfs = hdfs_native.Client(env["TYARD_HDFS_URL"])
    hdfs.mkdirs(f"/{PREFIX}", create_parent=True)
    for f in files:
        with hdfs.create(f"/{PREFIX}/{f.name}", hdfs_native.WriteOptions(overwrite=True)) as out:
            out.write(f.read_bytes())
    for f in (f for f in files if f.stat().st_size):
        hdfs.read(f"/{PREFIX}/{f.name}").read_range(0, 1)
    urls["hdfs (hdfs-native)"] = (f"{env['TYARD_HDFS_URL']}/{PREFIX}", {})
    urls["hdfs (webhdfs)"] = (f"{env['TYARD_WEBHDFS_URL']}/{PREFIX}", {})
    from tensoryard.data.stores import open_store

    web = open_store(urls["hdfs (webhdfs)"][0])  # the NameNode's HTTP paths warm up too
    for f in (f for f in files if f.stat().st_size):
        web.download_range(f.name, 0, 1, lambda _: None, 1)  # type: ignore[attr-defined]
    return urls


METADATA = ("manifest.json", "index.bin", "shards.json", "units.bin")


def needed_bytes(dataset: Path) -> int:
    """What one epoch needs from the backend: the metadata (units.bin where the dataset has
    one) and every token shard."""
    return sum((dataset / n).stat().st_size for n in METADATA if (dataset / n).exists()) + sum(
        p.stat().st_size for p in dataset.glob("shard-*.tok")
    )


def run_arm(
    url: str,
    options: dict[str, Any],
    work: Path,
    cfg: dict[str, Any],
    dataset: Path,
    *,
    service: bool | None = None,
) -> dict[str, Any]:
    """`ranks` processes reading one epoch together through one empty node cache; the node
    fetch service as the defaults decide (``service`` None), forced on (True) or off (False)."""
    cache, stats = work / "cache", work / "stats"
    shutil.rmtree(work, ignore_errors=True)
    stats.mkdir(parents=True)
    options = dict(options)
    creds = options.pop("_creds", None)
    env = os.environ.copy()
    if creds:
        env |= {"AWS_ACCESS_KEY_ID": creds[0], "AWS_SECRET_ACCESS_KEY": creds[1]}
    env["AWS_DEFAULT_REGION"] = "us-east-1"
    env.pop("TYARD_DATA_FETCH_SERVICE", None)
    if service is not None:
        env["TYARD_DATA_FETCH_SERVICE"] = "1" if service else "0"
    argv = [url, json.dumps(options), str(cache), str(stats)]
    shape = [str(cfg[k]) for k in ("ranks", "workers", "seq_len", "global_batch")]
    procs = [
        subprocess.Popen(
            [sys.executable, str(RANK), *argv, str(r), *shape],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for r in range(cfg["ranks"])
    ]
    ranks = []
    for proc in procs:
        out, err = proc.communicate(timeout=cfg["timeout_s"])
        if proc.returncode != 0:
            raise RuntimeError(f"rank failed on {url}: {err.decode()[-2000:]}")
        ranks.append(json.loads(out.decode().strip().splitlines()[-1]))
    fetched = [line.split() for log in stats.glob("*.log") for line in log.read_text().splitlines()]
    tokens = sum(r["tokens"] for r in ranks)
    wall = max(r["seconds"] for r in ranks)
    need = needed_bytes(dataset)
    got = sum(int(n) for _, n in fetched)
    # The node's fetch service counts what it fetched; the last rank to finish saw it all.
    seen = [r["service"] for r in ranks if r.get("service")]
    last: dict[str, Any] = max(seen, key=lambda s: s.get("requests", 0), default={})
    got += last.get("bytes", 0)
    reads = len(fetched) + last.get("requests", 0)
    fell_back = sum(1 for r in ranks if service and not r.get("service"))  # forced, not used
    return {
        "tokens_per_s": tokens / wall,
        "wall_s": wall,
        "first_batch_s_max": max(r["first_batch_s"] for r in ranks),
        "first_batch_s_median": statistics.median(r["first_batch_s"] for r in ranks),
        "bytes_fetched": got,
        "bytes_needed": need,
        "fetched_over_needed": got / need if "://" in url else None,
        "file_reads": reads if "://" in url else None,
        "files_needed": sum((dataset / n).exists() for n in METADATA)
        + len(list(dataset.glob("shard-*.tok"))),
        "peak_rss_mb_rank_max": max(r["peak_rss_mb"] for r in ranks),
        "peak_rss_mb_worker_max": max(r["peak_rss_worker_mb"] for r in ranks),
        "fetch_service": service,
        "ranks_without_the_service": fell_back if "://" in url else None,
    }


PEER_RANK = HERE / "_data_cold_peer.py"
PEER_WORKER = HERE / "_data_worker.py"
PEERS = ("litdata", "streaming")


def _client(env: dict[str, str]) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=env["MOTO_ENDPOINT"],
        aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )


def prepare_peers(
    dataset: Path, work: Path, env: dict[str, str], cfg: dict[str, Any]
) -> dict[str, Any]:
    """Convert the same tokens for each peer and upload them to moto: name -> (python,
    s3 URL, bytes uploaded), or an error string when the peer cannot be set up."""
    sys.path.insert(0, str(HERE))
    import _data_peers

    corpus = dataset.with_suffix(".u16")
    shards = max(1, cfg["megabytes"] // cfg["shard_mb"])
    client = _client(env)
    out: dict[str, Any] = {}
    for name in PEERS:
        try:
            python = _data_peers.ensure_cold_venv(name)
            local = work / f"peer-{name}"
            argv = [str(PEER_WORKER), "convert", name, str(corpus), str(local)]
            subprocess.run(
                [str(python), *argv, "--shards", str(shards)],
                check=True,
                capture_output=True,
                timeout=cfg["timeout_s"],
                env=os.environ | {"TMPDIR": str(_private_tmp(work / f"tmp-{name}"))},
            )
        except (RuntimeError, subprocess.SubprocessError) as exc:
            err = getattr(exc, "stderr", b"") or b""
            out[name] = f"{type(exc).__name__}: {exc} {err.decode(errors='replace')[-500:]}"
            continue
        files = [p for p in local.rglob("*") if p.is_file()]
        for f in files:
            client.upload_file(str(f), BUCKET, f"peers/{name}/{f.relative_to(local)}")
        out[name] = (python, f"s3://{BUCKET}/peers/{name}", sum(f.stat().st_size for f in files))
    return out


def _private_tmp(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _peer_port() -> int:
    for port in range(47150, 47200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 47150-47199 for the peers' process group")


def run_peer_arm(
    name: str,
    python: Path,
    remote: str,
    needed: int,
    work: Path,
    cfg: dict[str, Any],
    env: dict[str, str],
) -> dict[str, Any]:
    """`ranks` processes of peer `name` reading one epoch from `remote` through one node cache."""
    cache = work / "cache"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    penv = os.environ | CREDS
    penv |= {
        # The peers' default chunk directories and lock files go to the temporary directory
        # (litdata: <tmp>/chunks, streaming: <tmp>/000000_*_filelock): the arm's own.
        "TMPDIR": str(_private_tmp(work / "tmp")),
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": env["MOTO_ENDPOINT"],
        "S3_ENDPOINT_URL": env["MOTO_ENDPOINT"],
    }
    shape = [str(cfg["ranks"]), str(cfg["workers"]), str(_peer_port())]
    procs = [
        subprocess.Popen(
            [str(python), str(PEER_RANK), name, remote, str(cache), str(r), *shape],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=penv,
            cwd=work,
        )
        for r in range(cfg["ranks"])
    ]
    ranks = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=cfg["timeout_s"])
            if proc.returncode != 0:
                return {"error": f"rank failed: {err.decode(errors='replace')[-1500:]}"}
            ranks.append(json.loads(out.decode().strip().splitlines()[-1]))
    except subprocess.TimeoutExpired:
        return {"error": f"no epoch within {cfg['timeout_s']}s"}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    got = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) if cache.exists() else 0
    tokens = sum(r["tokens"] for r in ranks)
    wall = max(r["seconds"] for r in ranks)
    return {
        "tokens_per_s": tokens / wall,
        "tokens": tokens,
        "wall_s": wall,
        "first_batch_s_max": max(r["first_batch_s"] for r in ranks),
        "first_batch_s_median": statistics.median(r["first_batch_s"] for r in ranks),
        "bytes_fetched": got,
        "bytes_needed": needed,
        "fetched_over_needed": got / needed,
        "file_reads": None,
        "peak_rss_mb_rank_max": max(r["peak_rss_mb"] for r in ranks),
        "peak_rss_mb_worker_max": max(r["peak_rss_worker_mb"] for r in ranks),
    }


def thousand_ranks(url: str, work: Path, nodes: int, per_node: int) -> dict[str, Any]:
    """`nodes` x `per_node` ranks open the dataset; metadata fetches with and without the
    node-wide metadata cache."""
    sys.path.insert(0, str(HERE))
    from _data_cold_rank import CountingStore

    from tensoryard.data.cache import CacheConfig, ShardCache, open_store

    out: dict[str, Any] = {"ranks": nodes * per_node, "nodes": nodes}
    for mode, max_age in (("per_node", 300.0), ("per_rank", 0.0)):
        stats = work / f"index-{mode}"
        shutil.rmtree(stats, ignore_errors=True)
        stats.mkdir(parents=True)
        store = CountingStore(open_store(url), str(stats))
        started = time.perf_counter()
        for node in range(nodes):
            cfg = CacheConfig(cache_dir=stats / f"node-{node}", metadata_max_age_s=max_age)
            for _ in range(per_node):
                ShardCache(url, cfg, store=store).metadata_path("manifest.json")  # type: ignore[arg-type]
        seconds = time.perf_counter() - started
        reads = sum(len(p.read_text().splitlines()) for p in stats.glob("*.log"))
        out[mode] = {"metadata_reads": reads, "per_node": reads / nodes, "seconds": seconds}
    return out


def run_cold(cfg: dict[str, Any], progress: Any = None) -> dict[str, Any]:
    """Every arm of the cold-start benchmark, ``cfg["reps"]`` times in turn (each run of an arm
    with an empty cache and a fresh fetch service); returns the results dict, each arm the
    summary of its runs (`summarize`)."""
    work = Path(tempfile.mkdtemp(prefix=f"tensoryard-{os.getuid()}-cold-"))
    reps = int(cfg.get("reps", 1))
    try:
        dataset = make_dataset(work / "dataset", cfg["megabytes"], cfg["shard_mb"])
        runs: dict[str, list[dict[str, Any]]] = {}
        which = frozenset(cfg.get("backends", ALL_BACKENDS))
        with backends(work, which) as env:
            urls = upload(dataset, env, which)
            peers = prepare_peers(dataset, work, env, cfg)

            def arm(name: str, rep: int, run: Callable[..., dict[str, Any]]) -> None:
                """Run arm ``name`` once (``run``: every argument but ``work``)."""
                if progress is not None:
                    progress(f"{name} (run {rep + 1} of {reps})")
                runs.setdefault(name, []).append(run(work=work / f"arm-{rep}-{len(runs)}"))

            # Interleaved (every arm once, then again): a slow spell of the machine lands on
            # all arms, not on the runs of one.
            for rep in range(reps):
                mine = functools.partial(run_arm, cfg=cfg, dataset=dataset)
                arm("local (page cache)", rep, functools.partial(mine, str(dataset), {}))
                for name, (url, options) in urls.items():
                    arm(name, rep, functools.partial(mine, url, options))
                # The same S3 arm through the node's fetch service: what the service changes.
                url, options = urls["s3 (moto)"]
                arm(
                    "s3 (moto), through the fetch service",
                    rep,
                    functools.partial(mine, url, options, service=True),
                )
                for name, got in peers.items():
                    if isinstance(got, str):
                        runs[f"{name} (s3, moto)"] = [{"error": got}]
                        continue
                    python, remote, needed = got
                    arm(
                        f"{name} (s3, moto)",
                        rep,
                        functools.partial(
                            run_peer_arm, name, python, remote, needed, cfg=cfg, env=env
                        ),
                    )
            hdfs = urls.get("hdfs (hdfs-native)")
            index = None if hdfs is None else thousand_ranks(hdfs[0], work, cfg["nodes"], 8)
        arms = {name: summarize(got) for name, got in runs.items()}
        return {"arms": arms, "thousand_rank_start": index, "config": cfg, "goal": goal(arms)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm over its runs: the median run's tokens/s and first batch (the slowest rank of
    each run), the worst run's, every run's, and the worst of the rest (bytes fetched over
    needed farthest from 1, the most reads, the largest RSS). An arm with a failed run
    reports the failure."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return {"error": failed[0]["error"], "runs": len(runs), "failed_runs": len(failed)}
    if len(runs) == 1:
        return runs[0] | {"runs": 1}
    tps = [r["tokens_per_s"] for r in runs]
    first = [r["first_batch_s_max"] for r in runs]
    out = dict(runs[0])
    out |= {
        "runs": len(runs),
        "tokens_per_s": statistics.median(tps),
        "tokens_per_s_runs": tps,
        "wall_s": statistics.median(r["wall_s"] for r in runs),
        "first_batch_s_max": statistics.median(first),
        "first_batch_s_max_worst": max(first),
        "first_batch_s_max_runs": first,
        "first_batch_s_median": statistics.median(r["first_batch_s_median"] for r in runs),
        "peak_rss_mb_rank_max": max(r["peak_rss_mb_rank_max"] for r in runs),
        "peak_rss_mb_worker_max": max(r["peak_rss_mb_worker_max"] for r in runs),
    }
    ratios = [r["fetched_over_needed"] for r in runs if r.get("fetched_over_needed") is not None]
    if ratios:
        out["fetched_over_needed"] = max(ratios, key=lambda x: abs(x - 1.0))
        out["fetched_over_needed_runs"] = ratios
        out["bytes_fetched"] = max(r["bytes_fetched"] for r in runs)
    reads = [r["file_reads"] for r in runs if r.get("file_reads") is not None]
    if reads:
        out["file_reads"] = max(reads)
    fell_back = [r["ranks_without_the_service"] for r in runs if r.get("ranks_without_the_service")]
    if fell_back:
        out["ranks_without_the_service"] = max(fell_back)
    return out


def goal(arms: dict[str, Any]) -> dict[str, Any]:
    """The issue's cold goal on S3: tensoryard's tokens/s over the best peer's (>= 2x)."""
    peers = {
        k: a["tokens_per_s"] for k, a in arms.items() if k.startswith(PEERS) and "tokens_per_s" in a
    }
    ours = arms.get("s3 (moto)", {}).get("tokens_per_s")
    if not peers or ours is None:
        return {"best_peer": None, "ratio": None}
    best = max(peers, key=lambda k: peers[k])
    return {"best_peer": best, "ratio": ours / peers[best]}
