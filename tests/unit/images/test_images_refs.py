"""validate_image_ref against the OCI reference grammar; resolve_image for a job's `image:`."""

from __future__ import annotations

import pytest

from tensoryard import __version__
from tensoryard.images import ImageRefError, resolve_image, validate_image_ref
from tensoryard.images.matrix import parse_matrix

VALID = {
    "a bare repository": "ubuntu",
    "a Docker Hub path with a tag": "library/ubuntu:24.04",
    "a registry with a port": "localhost:5000/team/trainer:v1",
    "localhost without a port": "localhost/tensoryard/cpu:0.1.0",
    "a registry host with upper case (hosts are case-insensitive)": "Registry.Example.com/a/b:1",
    "separators inside components": "ghcr.io/my_org/my-img.v2__x:1.0-rc_1",
    "a digest only": "ghcr.io/a/b@sha256:" + "0123456789abcdef" * 4,
    "a tag and a digest": "ghcr.io/a/b:1@sha256:" + "f" * 64,
    "an IPv6 registry": "[::1]:5000/a:b",
    "a 128-character tag": "a:" + "t" * 128,
}

INVALID = {
    "an empty string": ("", "is empty"),
    "a space inside": ("ghcr.io/a b:1", "whitespace"),
    "a trailing newline": ("ghcr.io/a/b:1\n", "whitespace"),
    "upper case in the repository": ("ghcr.io/Team/img:1", "upper case in the repository"),
    "a tag starting with a dot": ("ghcr.io/a:.x", "invalid tag"),
    "a tag of 129 characters": ("a:" + "t" * 129, "invalid tag"),
    "an empty tag": ("ghcr.io/a:", "invalid tag"),
    "a short sha256 digest": ("ghcr.io/a@sha256:abc", "not 64 lower-case hex"),
    "a digest without an algorithm": ("ghcr.io/a@" + "a" * 64, "invalid digest"),
    "a double slash": ("ghcr.io//a", "empty path component"),
    "a component ending in a separator": ("ghcr.io/a-/b", "invalid repository component"),
    "a port that is not a number": ("host:port/a", "not a number"),
    "a name over 255 characters": ("a/" + "b" * 260, "longer than 255"),
}


@pytest.mark.parametrize("ref", list(VALID.values()), ids=list(VALID))
def test_a_valid_reference_passes(ref: str) -> None:
    validate_image_ref(ref)


@pytest.mark.parametrize(
    ("ref", "problem"), list(INVALID.values()), ids=[f"refuses {k}" for k in INVALID]
)
def test_an_invalid_reference_is_refused_with_the_field_and_a_fix(ref: str, problem: str) -> None:
    with pytest.raises(ImageRefError) as err:
        validate_image_ref(ref, field="spec.image")
    assert problem in str(err.value)
    assert str(err.value).startswith("spec.image: ")
    assert err.value.fix and "fix:" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_a_matrix_name_resolves_to_the_registry_name_and_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TYARD_IMAGE_REGISTRY", raising=False)
    assert resolve_image("cpu") == f"localhost/tensoryard/cpu:{__version__}"
    monkeypatch.setenv("TYARD_IMAGE_REGISTRY", "registry.example.com:5000/ml/")
    assert resolve_image("cpu") == f"registry.example.com:5000/ml/cpu:{__version__}"
    assert resolve_image("cpu", registry="ghcr.io/org").startswith("ghcr.io/org/cpu:")


def test_a_bad_registry_setting_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TYARD_IMAGE_REGISTRY", "Registry Example/ml")
    with pytest.raises(ImageRefError, match="TYARD_IMAGE_REGISTRY"):
        resolve_image("cpu")


def test_a_full_reference_is_returned_unchanged() -> None:
    ref = "ghcr.io/org/trainer:2.13@sha256:" + "a" * 64
    assert resolve_image(ref) == ref


def test_a_near_miss_of_a_matrix_name_suggests_the_entry() -> None:
    with pytest.raises(ImageRefError) as err:
        resolve_image("pytorch-2.13-cu12x", field="jobs[0].image")
    text = str(err.value)
    assert text.startswith("jobs[0].image: 'pytorch-2.13-cu12x' is neither")
    assert "did you mean 'pytorch-2.13-cu130'" in text


def test_a_bare_word_is_not_silently_taken_as_a_docker_hub_image() -> None:
    with pytest.raises(ImageRefError, match=r"docker\.io/library/NAME:TAG"):
        resolve_image("ubuntu")


def test_whitespace_in_a_bare_word_is_reported_as_whitespace() -> None:
    with pytest.raises(ImageRefError, match="whitespace"):
        resolve_image("cpu ")


def test_resolution_uses_the_matrix_it_is_given() -> None:
    matrix = parse_matrix(
        {"entries": {"tiny": {"flavour": "control-plane", "python": "3.11", "torch": None}}}
    )
    assert resolve_image("tiny", matrix=matrix, registry="r.example/x") == (
        f"r.example/x/tiny:{__version__}"
    )
    with pytest.raises(ImageRefError, match="tiny"):
        resolve_image("cpu", matrix=matrix)
