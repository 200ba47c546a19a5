"""Tokenizers for dataset preparation: a built-in byte-level one and Hugging Face tokenizer.json.

Each tokenizer has a `fingerprint` (a content hash written into the manifest, so a loader can
refuse data prepared with another tokenizer) and a `spec` (a small JSON-able dict that rebuilds
the same tokenizer inside a worker process).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tensoryard.data._util import digest_bytes
from tensoryard.errors import DataError

__all__ = [
    "BYTE_EOS_ID",
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "token_dtype",
    "tokenizer_from_spec",
    "tokenizer_meta",
]

BYTE_EOS_ID = 256
# Special tokens tried, in order, when a tokenizer.json is given without an explicit EOS token.
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]", "<|im_end|>")


@runtime_checkable
class Tokenizer(Protocol):
    """What `prepare` needs from a tokenizer."""

    @property
    def name(self) -> str:
        """A human-readable name (`byte`, or the tokenizer.json path)."""
        ...

    @property
    def vocab_size(self) -> int:
        """Number of ids, including special tokens; every id is below it."""
        ...

    @property
    def eos_id(self) -> int:
        """The id written after every document."""
        ...

    def fingerprint(self) -> str:
        """A content hash that identifies the vocabulary and rules."""
        ...

    def spec(self) -> dict[str, Any]:
        """A JSON-able recipe that `tokenizer_from_spec` turns back into this tokenizer."""
        ...

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text (no EOS appended)."""
        ...


def token_dtype(vocab_size: int) -> np.dtype[Any]:
    """uint16 while every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, and 256 as the end-of-document id."""

    name = "byte"
    vocab_size = BYTE_EOS_ID + 1
    eos_id = BYTE_EOS_ID

    def fingerprint(self) -> str:
        return digest_bytes(b"tensoryard-byte-tokenizer-v1")

    def spec(self) -> dict[str, Any]:
        return {"kind": "byte"}

    def encode(self, text: str) -> np.ndarray:
        """Token ids of one text."""
        return np.frombuffer(text.encode("utf-8", errors="replace"), dtype=np.uint8)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: np.ndarray) -> str:
        """Text of `ids`; EOS ids become newlines."""
        arr = np.asarray(ids)
        return bytes(np.where(arr == BYTE_EOS_ID, 10, arr).astype(np.uint8)).decode(
            "utf-8", errors="replace"
        )


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer loaded from a tokenizer.json file."""

    def __init__(
        self, json_text: str, *, name: str = "tokenizer.json", eos_token: str = ""
    ) -> None:
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise DataError(
                "reading a tokenizer.json needs the `tokenizers` package "
                "(fix: pip install 'tensoryard[data]')"
            ) from exc
        try:
            self._tok = _HF.from_str(json_text)
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise DataError(f"{name}: not a valid Hugging Face tokenizer.json ({exc})") from exc
        self._json = json_text
        self._name = name
        self._eos_token = eos_token or self._find_eos()
        eos = self._tok.token_to_id(self._eos_token)
        if eos is None:
            raise DataError(
                f"{name}: EOS token {self._eos_token!r} is not in the vocabulary "
                "(fix: pass --eos-token with one of its special tokens)"
            )
        self._eos = int(eos)

    @classmethod
    def from_file(cls, path: str | Path, *, eos_token: str = "") -> HFTokenizer:
        """Load a tokenizer.json from disk."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise DataError(f"{p}: cannot read tokenizer file ({exc.strerror})") from exc
        return cls(text, name=str(p), eos_token=eos_token)

    def _find_eos(self) -> str:
        vocab = self._tok.get_vocab(with_added_tokens=True)
        for cand in _EOS_CANDIDATES:
            if cand in vocab:
                return cand
        raise DataError(
            f"{self._name}: no end-of-document token found (tried {', '.join(_EOS_CANDIDATES)}) "
            "(fix: pass --eos-token TOKEN)"
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def eos_id(self) -> int:
        return self._eos

    def fingerprint(self) -> str:
        # The EOS choice changes the data, so it is part of the identity.
        return digest_bytes(self._json.encode("utf-8") + b"\0eos=" + self._eos_token.encode())

    def spec(self) -> dict[str, Any]:
        return {"kind": "hf", "json": self._json, "name": self._name, "eos_token": self._eos_token}

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encs = self._tok.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encs]

    def decode(self, ids: np.ndarray) -> str:
        """Text of `ids`."""
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))


def tokenizer_from_spec(spec: dict[str, Any]) -> ByteTokenizer | HFTokenizer:
    """Rebuild a tokenizer from its `spec()`."""
    if spec.get("kind") == "byte":
        return ByteTokenizer()
    if spec.get("kind") == "hf":
        return HFTokenizer(spec["json"], name=spec.get("name", ""), eos_token=spec["eos_token"])
    raise DataError(f"unknown tokenizer spec kind {spec.get('kind')!r}")


def load_tokenizer(ref: str | Path | Tokenizer, *, eos_token: str = "") -> Tokenizer:
    """`byte` for the built-in byte tokenizer, or a path to a tokenizer.json."""
    if isinstance(ref, Tokenizer):
        return ref
    if str(ref) == "byte":
        return ByteTokenizer()
    path = Path(ref)
    if not path.is_file():
        raise DataError(
            f"tokenizer {str(ref)!r}: not 'byte' and not an existing tokenizer.json file "
            "(fix: --tokenizer byte or --tokenizer PATH/tokenizer.json)"
        )
    return HFTokenizer.from_file(path, eos_token=eos_token)


def tokenizer_meta(tok: Tokenizer) -> dict[str, Any]:
    """The manifest's record of a tokenizer (its hash is what loaders compare)."""
    return {
        "name": tok.name,
        "hash": tok.fingerprint(),
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "kind": tok.spec()["kind"],
    }
