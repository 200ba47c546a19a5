"""A real file:// store (`FsspecStore`) that records every request and may alter the bytes of
a ranged one: the data tests count requests and corrupt ranges with it."""

from __future__ import annotations

from collections.abc import Callable

from tensoryard.data.cache import FsspecStore

__all__ = ["RecordingStore"]


class RecordingStore(FsspecStore):
    """`calls` holds (key, start, stop) per request, (key, 0, -1) for a whole file;
    `alter(key, start, data)` may change what a ranged request returns."""

    def __init__(self, root: str, alter: Callable[[str, int, bytes], bytes] | None = None) -> None:
        super().__init__(root)
        self.calls: list[tuple[str, int, int]] = []
        self.alter = alter

    def download(self, key: str, sink: Callable[[bytes], None], chunk_bytes: int) -> None:
        self.calls.append((key, 0, -1))
        super().download(key, sink, chunk_bytes)

    def download_range(
        self, key: str, start: int, stop: int, sink: Callable[[bytes], None], chunk_bytes: int
    ) -> None:
        self.calls.append((key, start, stop))
        if self.alter is None:
            super().download_range(key, start, stop, sink, chunk_bytes)
            return
        buf = bytearray()
        super().download_range(key, start, stop, buf.extend, chunk_bytes)
        sink(self.alter(key, start, bytes(buf)))

    def requests_for(self, key: str, offset: int) -> int:
        """Ranged requests of `key` whose range holds byte `offset`."""
        return sum(1 for k, a, b in self.calls if k == key and a <= offset < b)
