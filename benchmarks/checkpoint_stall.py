"""How long a checkpoint save stops training: synchronous vs asynchronous, pageable vs pinned.

    python benchmarks/checkpoint_stall.py       # JSON: benchmarks/results/checkpoint_stall_cpu.json
    python benchmarks/checkpoint_stall.py --device cuda --d-model 1024 --layers 12 --heads 16

One process builds the tiny GPT of examples/tiny_gpt at the given size, takes an optimizer step
(so AdamW's state exists, as in training) and saves it with tensoryard's Checkpointer, in the
same run:

- layout "full" (what DDP jobs save): synchronous; asynchronous staged into pageable memory;
  asynchronous staged into pinned memory (GPU only: on the CPU both are one plain copy);
- layout "sharded" (FSDP2 on one rank, torch.distributed.checkpoint): synchronous and
  asynchronous (DCP's stager, pinned on a GPU).

The stall is how long `save` blocks the training loop (`Checkpointer.last_stall_s`); the save
time is snapshot to committed checkpoint. Each arm saves `--repeats` times; the first save of an
async arm also allocates its staging buffers, so it is reported apart and the median is over the
others. Ratios: async stall / sync stall per layout (the issue's goal: < 10%) and pinned /
pageable stall. The physical limit is printed beside: the state's bytes over the GPU->host copy
rate measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tiny_gpt"
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(EXAMPLE))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import benchmark_main, provenance  # noqa: E402

NAME = "checkpoint_stall"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _build(args: argparse.Namespace, device: Any, sharded: bool) -> tuple[Any, Any, int]:
    import torch
    from model import GPTConfig, TinyGPT

    torch.manual_seed(0)
    config = GPTConfig(
        seq_len=128, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, dropout=0.0
    )
    model = TinyGPT(config).to(device)
    if sharded:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:  # type: ignore[attr-defined]
            fully_shard(block)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, 256, (2, 129), device=device)
    model(batch[:, :-1], batch[:, 1:]).backward()
    optimizer.step()  # AdamW's state exists, as in training
    params = sum(p.numel() for p in model.parameters())
    return model, optimizer, params


def _step_time(model: Any, optimizer: Any, device: Any, repeats: int = 5) -> float:
    import torch

    batch = torch.randint(0, 256, (8, 129), device=device)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(batch[:, :-1], batch[:, 1:]).backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def _arm(
    work: Path, name: str, model: Any, optimizer: Any, dist: Any, repeats: int, **kw: Any
) -> dict[str, Any]:
    from tensoryard.runtime.checkpoint import Checkpointer

    ckpt = Checkpointer(work / name, interval=1, keep=1, dist=dist, **kw)
    stalls, totals = [], []
    for step in range(1, repeats + 1):
        ckpt.save(step, model, optimizer)
        stalls.append(ckpt.last_stall_s or 0.0)
        ckpt.wait()
        totals.append(ckpt.last_save_s or 0.0)
        print(f"  {name} save {step}: stall {stalls[-1]:.3f}s, save {totals[-1]:.3f}s", flush=True)
    steady = stalls[1:] or stalls
    return {
        "stall_s": round(statistics.median(steady), 4),
        "first_stall_s": round(stalls[0], 4),
        "save_s": round(statistics.median(totals), 4),
        "bytes": ckpt.checkpoints()[0].size_bytes,
    }


def _d2h_rate(device: Any, nbytes: int) -> float | None:
    """GPU -> pinned host copy rate (bytes/s) of one buffer the state's size, capped at 4 GiB."""
    import torch

    if device.type != "cuda":
        return None
    n = min(nbytes, 4 << 30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return 3 * n / (time.perf_counter() - started)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as tdist

    from tensoryard.runtime.dist import DistContext

    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "d_model": args.d_model,
        "layers": args.layers,
        "repeats": args.repeats,
    }
    with tempfile.TemporaryDirectory(prefix="tyard-ckpt-", dir=args.dir) as tmp:
        work = Path(tmp)
        model, optimizer, params = _build(args, device, sharded=False)
        report["params"] = params
        report["step_s"] = round(_step_time(model, optimizer, device), 4)
        single = DistContext(0, 1, 0, 1, device, None)
        full: dict[str, Any] = {
            "sync": _arm(work, "full-sync", model, optimizer, single, args.repeats)
        }
        full["async_pageable"] = _arm(
            work,
            "full-async-pageable",
            model,
            optimizer,
            single,
            args.repeats,
            async_save=True,
            pin_memory=False,
        )
        if device.type == "cuda":
            full["async_pinned"] = _arm(
                work,
                "full-async-pinned",
                model,
                optimizer,
                single,
                args.repeats,
                async_save=True,
                pin_memory=True,
            )
        report["full"] = full
        rate = _d2h_rate(device, full["sync"]["bytes"])
        if rate is not None:
            report["d2h_gb_s"] = round(rate / 1e9, 2)
            report["d2h_limit_s"] = round(full["sync"]["bytes"] / rate, 4)
        del model, optimizer

        if not args.no_sharded:
            backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
            tdist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
            )
            try:
                if device.type == "cuda":
                    torch.cuda.set_device(device)
                model, optimizer, _ = _build(args, device, sharded=True)
                group = DistContext(0, 1, 0, 1, device, "nccl" if device.type == "cuda" else "gloo")
                report["sharded"] = {
                    "sync": _arm(work, "sharded-sync", model, optimizer, group, args.repeats),
                    "async": _arm(
                        work,
                        "sharded-async",
                        model,
                        optimizer,
                        group,
                        args.repeats,
                        async_save=True,
                    ),
                }
            finally:
                tdist.destroy_process_group()

    ratios: dict[str, float] = {}
    best_async = full.get("async_pinned", full["async_pageable"])
    ratios["full_async_over_sync_stall"] = round(best_async["stall_s"] / full["sync"]["stall_s"], 4)
    if "async_pinned" in full:
        ratios["full_pinned_over_pageable_stall"] = round(
            full["async_pinned"]["stall_s"] / full["async_pageable"]["stall_s"], 4
        )
    if "sharded" in report:
        sh = report["sharded"]
        ratios["sharded_async_over_sync_stall"] = round(
            sh["async"]["stall_s"] / sh["sync"]["stall_s"], 4
        )
    if "d2h_limit_s" in report:
        ratios["pinned_stall_over_d2h_limit"] = round(
            full["async_pinned"]["stall_s"] / report["d2h_limit_s"], 3
        )
    report["ratios"] = ratios
    return report


GOAL = "async save stalls the step < 10% of the synchronous save"


def summary(report: dict[str, Any]) -> tuple[str, str]:
    """The RESULTS.md row's result and met columns, from a run's JSON."""
    full, r = report["full"], report["ratios"]
    parts = [
        f"{report['device']}, {report['params'] / 1e6:.0f}M params, "
        f"{full['sync']['bytes'] / 1e9:.2f} GB per checkpoint, "
        f"step {report['step_s'] * 1000:.0f} ms",
        f"full: sync stall {full['sync']['stall_s']:.3f} s, async pageable "
        f"{full['async_pageable']['stall_s']:.3f} s",
    ]
    if "async_pinned" in full:
        parts.append(
            f"async pinned {full['async_pinned']['stall_s']:.3f} s "
            f"(pinned/pageable {r['full_pinned_over_pageable_stall']:.2f}; "
            f"GPU->host limit {report['d2h_limit_s']:.3f} s at {report['d2h_gb_s']} GB/s)"
        )
    parts.append(f"async/sync {r['full_async_over_sync_stall']:.1%}")
    if "sharded" in report:
        sh = report["sharded"]
        parts.append(
            f"sharded (FSDP2, DCP): sync {sh['sync']['stall_s']:.3f} s, async "
            f"{sh['async']['stall_s']:.3f} s = {r['sharded_async_over_sync_stall']:.1%}"
        )
    parts.append(f"load average at the end {report['load_average']}")
    worst = max(v for k, v in r.items() if k.endswith("async_over_sync_stall"))
    return "; ".join(parts), "yes" if worst < 0.10 else f"no (worst {worst:.1%})"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.repeats < 2:
        sys.exit("--repeats must be at least 2 (the first save of an arm warms up)")
    if args.no_results:
        args.no_results_line = True
    report = run(args)
    print(json.dumps(report["ratios"]))
    return {**provenance("checkpoint_stall.py"), **report}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=4, help="saves per arm (>= 2)")
    parser.add_argument("--dir", default=None, help="where checkpoints are written (a temp dir)")
    parser.add_argument("--no-sharded", action="store_true", help="skip the FSDP2/DCP arms")
    parser.add_argument("--no-results", action="store_true", help="the same as --no-results-line")


if __name__ == "__main__":
    benchmark_main(
        NAME,
        __doc__,
        GOAL,
        measure,
        summary,
        add_arguments,
        json_name=lambda args: f"{NAME}_{args.device.split(':')[0]}",
        row_name=lambda report: f"{NAME} ({report['device']})",
    )
