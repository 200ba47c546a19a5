"""Tokenizers: the built-in byte tokenizer and Hugging Face tokenizer.json files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from tensoryard.data import ByteTokenizer, HFTokenizer, load_tokenizer
from tensoryard.data.tokenizer import token_dtype, tokenizer_from_spec
from tensoryard.errors import DataError


def word_level_json(words: list[str], specials: list[str]) -> str:
    vocab = {w: i for i, w in enumerate(specials + words)}
    tok = Tokenizer(WordLevel(vocab, unk_token=specials[0] if specials else None))
    tok.pre_tokenizer = Whitespace()
    return tok.to_str()


@pytest.fixture
def hf_json(tmp_path: Path) -> Path:
    path = tmp_path / "tokenizer.json"
    path.write_text(word_level_json(["hello", "world", "again"], ["[UNK]", "<|endoftext|>"]))
    return path


def test_the_byte_tokenizer_maps_utf8_bytes_and_reserves_256_for_eos() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("héllo")
    assert ids.tolist() == list("héllo".encode())
    assert tok.eos_id == 256 and tok.vocab_size == 257
    assert tok.decode(np.append(ids, 256)) == "héllo\n"


def test_a_tokenizer_json_finds_its_end_of_text_token(hf_json: Path) -> None:
    tok = HFTokenizer.from_file(hf_json)
    assert tok.eos_id == 1
    assert [a.tolist() for a in tok.encode_batch(["hello world", "again"])] == [[2, 3], [4]]


def test_a_tokenizer_survives_the_trip_to_a_worker_process(hf_json: Path) -> None:
    tok = HFTokenizer.from_file(hf_json)
    clone = tokenizer_from_spec(json.loads(json.dumps(tok.spec())))
    assert clone.fingerprint() == tok.fingerprint()
    assert tokenizer_from_spec({"kind": "byte"}).fingerprint() == ByteTokenizer().fingerprint()


def test_fingerprints_tell_tokenizers_apart(hf_json: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(word_level_json(["hello", "world"], ["[UNK]", "<|endoftext|>"]))
    prints = {
        ByteTokenizer().fingerprint(),
        HFTokenizer.from_file(hf_json).fingerprint(),
        HFTokenizer.from_file(other).fingerprint(),
        HFTokenizer.from_file(hf_json, eos_token="[UNK]").fingerprint(),
    }
    assert len(prints) == 4


def test_a_tokenizer_without_an_eos_token_asks_for_one(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(word_level_json(["a", "b"], ["[UNK]", "<sep>"]))
    with pytest.raises(DataError, match="--eos-token"):
        HFTokenizer.from_file(path)
    assert HFTokenizer.from_file(path, eos_token="<sep>").eos_id == 1
    with pytest.raises(DataError, match="'<nope>' is not in the vocabulary"):
        HFTokenizer.from_file(path, eos_token="<nope>")


@pytest.mark.parametrize(
    ("content", "ref", "expected"),
    [
        ("{not json", "t.json", "not a valid Hugging Face tokenizer.json"),
        (None, "missing.json", "not 'byte' and not an existing tokenizer.json"),
    ],
    ids=["a file that is not a tokenizer", "a path that does not exist"],
)
def test_a_bad_tokenizer_reference_is_a_clear_error(
    tmp_path: Path, content: str | None, ref: str, expected: str
) -> None:
    if content is not None:
        (tmp_path / ref).write_text(content)
    with pytest.raises(DataError, match=expected):
        load_tokenizer(tmp_path / ref)


@pytest.mark.parametrize(
    ("vocab", "dtype"),
    [(257, np.uint16), (65_536, np.uint16), (65_537, np.uint32), (151_000, np.uint32)],
    ids=["bytes fit 16 bits", "exactly 2**16 ids fit", "one more needs 32", "a large vocab"],
)
def test_token_width_follows_the_vocabulary(vocab: int, dtype: type) -> None:
    assert token_dtype(vocab) == np.dtype(dtype)
