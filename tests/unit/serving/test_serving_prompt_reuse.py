"""Reading a llama.cpp replica's per-prompt reuse lines back (the serving benchmark's measure
of how much of each prompt the engines took from their caches)."""

from __future__ import annotations

from pathlib import Path

from tensoryard.serving.engine import prompt_reuse


def test_reuse_lines_are_summed_from_an_offset_and_other_lines_ignored(tmp_path: Path) -> None:
    log = tmp_path / "replica-0.log"
    assert prompt_reuse(log) == (0, 0, 0)  # no log yet
    log.write_text(
        "INFO:     Started server process [1]\n"
        "tyard-replica: prompt of 5 tokens, 0 reused\n"
        "tyard-replica: prompt cache: stored a state of 7 tokens; 1 held, 0.2 MB\n"
        "tyard-replica: prompt of 1040 tokens, 1012 reused\n"
    )
    prompt, reused, end = prompt_reuse(log)
    assert (prompt, reused) == (1045, 1012) and end == log.stat().st_size
    with log.open("a") as f:
        f.write("tyard-replica: prompt of 1030 tokens, 3 reused\n")
    assert prompt_reuse(log, start=end)[:2] == (1030, 3)
