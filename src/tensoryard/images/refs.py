"""Image references: validate one against the OCI reference grammar, resolve a job's ``image:``.

The grammar (github.com/distribution/reference, the one containerd, Docker and Kubernetes use)::

    reference   := name [ ":" tag ] [ "@" digest ]
    name        := [domain "/"] component ("/" component)*
    domain      := host [":" port]        host: DNS labels joined by ".", or [IPv6]
    component   := [a-z0-9]+ (separator [a-z0-9]+)*      separator: "." "_" "__" or "-"+
    tag         := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest      := algorithm ":" hex      sha256: 64 hex digits, sha512: 128

The first path part is a domain when it holds "." or ":" or is ``localhost``. The name is at most
255 characters.
"""

from __future__ import annotations

import difflib
import os
import re

from tensoryard import __version__, envvars
from tensoryard.errors import TensoryardError
from tensoryard.images.matrix import Matrix, default_matrix

__all__ = [
    "DEFAULT_REGISTRY",
    "ImageRefError",
    "image_ref_for",
    "resolve_image",
    "validate_image_ref",
]

DEFAULT_REGISTRY = "localhost/tensoryard"
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_DOMAIN_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_ALGORITHM = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*")
_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
_EXAMPLE = "registry.example.com/team/trainer:1.0"


class ImageRefError(TensoryardError, ValueError):
    """An image reference or a job's ``image:`` is invalid. A ValueError too, so pydantic
    validators may raise it unchanged. ``field`` names the setting, ``fix`` the remedy."""

    def __init__(self, field: str, value: str, problem: str, fix: str) -> None:
        self.field, self.value, self.problem, self.fix = field, value, problem, fix
        super().__init__(f"{field}: {value!r} {problem} (fix: {fix})")


def _split(ref: str) -> tuple[str, str | None, str | None]:
    """'host/a/b:tag@sha256:...' -> ('host/a/b', 'tag', 'sha256:...')."""
    name, at, rest = ref.partition("@")
    digest = rest if at else None
    tag = None
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:
        name, tag = name[:colon], name[colon + 1 :]
    return name, tag, digest


def _check_domain(ref: str, domain: str, field: str) -> None:
    if domain.startswith("["):
        if not re.fullmatch(r"\[[0-9A-Fa-f:.]+\](?::[0-9]+)?", domain):
            raise ImageRefError(
                field, ref, f"has an invalid IPv6 registry {domain!r}", "write it as [address]:port"
            )
        return
    host, sep, port = domain.partition(":")
    if not all(_DOMAIN_LABEL.fullmatch(label) for label in host.split(".")):
        raise ImageRefError(
            field, ref, f"has an invalid registry host {host!r}", "write it as host[:port]"
        )
    if sep and not port.isdigit():
        raise ImageRefError(
            field,
            ref,
            f"has a registry port {port!r} that is not a number",
            "write the registry as host:PORT (digits), or drop the ':'",
        )


def _hint() -> str:
    return f"write it like {_EXAMPLE}"


def _check_path(ref: str, path: str, field: str) -> None:
    for component in path.split("/"):
        if component == "":
            raise ImageRefError(
                field,
                ref,
                "has an empty path component ('//' or a '/' at an end)",
                "remove the extra '/'",
            )
        if component != component.lower() and _COMPONENT.fullmatch(component.lower()):
            raise ImageRefError(
                field,
                ref,
                f"has upper case in the repository ({component!r})",
                f"repository names are lower case: use {component.lower()!r}",
            )
        if not _COMPONENT.fullmatch(component):
            raise ImageRefError(
                field,
                ref,
                f"has an invalid repository component {component!r}",
                "use lower-case letters, digits and single '.', '_' or '-' between them",
            )


def _check_digest(ref: str, digest: str, field: str) -> None:
    algorithm, sep, encoded = digest.partition(":")
    if not sep or not _ALGORITHM.fullmatch(algorithm) or not encoded:
        raise ImageRefError(
            field, ref, f"has an invalid digest {digest!r}", "write it as @sha256:<64 hex digits>"
        )
    want = _DIGEST_HEX.get(algorithm)
    if want is not None and not re.fullmatch(rf"[0-9a-f]{{{want}}}", encoded):
        raise ImageRefError(
            field,
            ref,
            f"has a {algorithm} digest that is not {want} lower-case hex digits",
            f"copy the digest whole: @{algorithm}:<{want} hex digits>",
        )


def validate_image_ref(ref: str, *, field: str = "image") -> None:
    """Raise ImageRefError (a ValueError) unless ``ref`` is a valid OCI image reference."""
    if not isinstance(ref, str) or not ref:
        raise ImageRefError(field, str(ref), "is empty", _hint())
    if any(ch.isspace() for ch in ref):
        raise ImageRefError(field, ref, "contains whitespace", "remove the spaces and newlines")
    name, tag, digest = _split(ref)
    if len(name) > 255:
        raise ImageRefError(field, ref, "has a name longer than 255 characters", "shorten it")
    if tag is not None and not _TAG.fullmatch(tag):
        raise ImageRefError(
            field,
            ref,
            f"has an invalid tag {tag!r}",
            "a tag is 1-128 letters, digits, '_', '.' or '-', not starting with '.' or '-'",
        )
    if digest is not None:
        _check_digest(ref, digest, field)
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        _check_domain(ref, first, field)
        _check_path(ref, rest, field)
    else:
        _check_path(ref, name, field)


def image_ref_for(name: str, *, registry: str | None = None, version: str = __version__) -> str:
    """The reference the builder tags a matrix image with: REGISTRY/NAME:VERSION.

    REGISTRY is ``registry``, else ``$TYARD_IMAGE_REGISTRY``, else ``localhost/tensoryard`` (the
    name images get when imported into a node's containerd without a registry)."""
    prefix = (registry or os.environ.get(envvars.IMAGE_REGISTRY.name) or DEFAULT_REGISTRY).rstrip(
        "/"
    )
    ref = f"{prefix}/{name}:{version}"
    validate_image_ref(ref, field=envvars.IMAGE_REGISTRY.name if registry is None else "registry")
    return ref


def resolve_image(
    name_or_ref: str,
    *,
    field: str = "image",
    matrix: Matrix | None = None,
    registry: str | None = None,
) -> str:
    """A job's ``image:`` as a full reference: a matrix name (``cpu``) becomes
    REGISTRY/NAME:VERSION (:func:`image_ref_for`); a full reference is validated and returned
    unchanged. Anything else raises ImageRefError naming ``field`` and the fix."""
    matrix = matrix or default_matrix()
    if not isinstance(name_or_ref, str) or not name_or_ref.strip():
        names = ", ".join(matrix.entries)
        raise ImageRefError(
            field,
            str(name_or_ref or ""),
            "is empty",
            f"name a matrix image ({names}) or a full reference",
        )
    if name_or_ref in matrix.entries:
        return image_ref_for(name_or_ref, registry=registry)
    if any(ch in "/:@" or ch.isspace() for ch in name_or_ref):
        validate_image_ref(name_or_ref, field=field)
        return name_or_ref
    known = list(matrix.entries)
    close = difflib.get_close_matches(name_or_ref, known, n=1)
    fix = f"did you mean {close[0]!r}? " if close else ""
    fix += (
        f"use a matrix image ({', '.join(known)}; `tyard images list`) or a full reference "
        f"such as {_EXAMPLE} (docker.io/library/NAME:TAG for Docker Hub)"
    )
    raise ImageRefError(field, name_or_ref, "is neither a matrix image nor a full reference", fix)
