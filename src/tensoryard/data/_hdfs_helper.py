"""Reads HDFS files for a process that cannot use hdfs-native itself.

hdfs-native runs its I/O on a process-wide runtime whose threads do not survive ``fork``: a
DataLoader worker forked after its rank opened HDFS would hang on its first read. Such a
process starts this helper (a fresh interpreter) once and asks it for files over a pipe.

Protocol: one request per line on stdin, a path or ``path<TAB>start<TAB>stop`` (bytes
``[start, stop)`` of the file); for each, frames on stdout of an 8-byte signed
little-endian length then that many bytes. ``n > 0``: data; ``0``: end of file; ``-n``: an
error, whose n bytes are ``<kind> <message>`` (kind: missing, denied, io).
"""

from __future__ import annotations

import struct
import sys
from typing import BinaryIO

CHUNK = 8 << 20
_HEADER = struct.Struct("<q")


def _frame(out: BinaryIO, data: bytes) -> None:
    out.write(_HEADER.pack(len(data)))
    out.write(data)


def _error(out: BinaryIO, kind: str, message: str) -> None:
    body = f"{kind} {message}".encode()
    out.write(_HEADER.pack(-len(body)))
    out.write(body)


def serve(root: str, inp: BinaryIO, out: BinaryIO) -> None:
    import fsspec
    import hdfs_native.fsspec  # noqa: F401  (registers hdfs://)

    fs, _ = fsspec.core.url_to_fs(root)
    for raw in inp:
        path, *span = raw.decode().rstrip("\n").split("\t")
        try:
            with fs.open(path, "rb") as src:
                if span:
                    start, left = int(span[0]), int(span[1]) - int(span[0])
                    src.seek(start)
                    while left > 0 and (chunk := src.read(min(CHUNK, left))):
                        _frame(out, chunk)
                        left -= len(chunk)
                else:
                    while chunk := src.read(CHUNK):
                        _frame(out, chunk)
            out.write(_HEADER.pack(0))
        except FileNotFoundError as exc:
            _error(out, "missing", str(exc).splitlines()[0] if str(exc) else path)
        except PermissionError as exc:
            _error(out, "denied", str(exc).splitlines()[0] if str(exc) else path)
        except Exception as exc:  # every other failure is worth a retry by the caller
            _error(
                out, "io", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            )
        out.flush()


if __name__ == "__main__":
    serve(sys.argv[1], sys.stdin.buffer, sys.stdout.buffer)
