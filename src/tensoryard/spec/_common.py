"""Shared pieces of the spec language: strict base model, quantities, error translation."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from tensoryard.errors import FieldIssue, SpecError

__all__ = [
    "StrictModel",
    "load_yaml_text",
    "parse_duration_s",
    "parse_memory_bytes",
    "read_spec_file",
    "spec_error_from_validation",
]


class StrictModel(BaseModel):
    """Base of every spec: unknown fields are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


_MEM_UNITS = {
    "": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}
_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]i?)?[bB]?\s*$")


def parse_memory_bytes(value: Any) -> int:
    """'16Gi' -> 17179869184; ints are bytes. Raises ValueError with the accepted forms."""
    if isinstance(value, bool):
        raise ValueError("memory must be a size like '16Gi', not a boolean")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("memory must not be negative")
        return int(value)
    if not isinstance(value, str):
        raise ValueError("memory must be a size like '16Gi' or a number of bytes")
    match = _MEM_RE.match(value)
    if not match:
        raise ValueError(f"cannot read memory size {value!r}; write it like '512Mi' or '16Gi'")
    number, unit = match.groups()
    return int(float(number) * _MEM_UNITS[(unit or "").lower()])


_DUR_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DUR_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration_s(value: Any) -> float:
    """'1h30m' -> 5400.0; numbers are seconds. Raises ValueError naming the accepted forms."""
    if isinstance(value, bool):
        raise ValueError("a duration must be like '30m', not a boolean")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a duration must not be negative")
        return float(value)
    if not isinstance(value, str):
        raise ValueError("a duration must be like '90s', '30m', '2h' or a number of seconds")
    text = value.strip().replace(" ", "")
    parts = _DUR_RE.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"cannot read duration {value!r}; write it like '90s', '30m' or '1h30m'")
    return float(sum(float(n) * _DUR_UNITS[u] for n, u in parts))


MAX_SPEC_BYTES = 256 * 1024
"""A spec file or YAML text larger than this is refused (a spec is a few hundred bytes)."""
MAX_FLOW_DEPTH = 64
"""Deepest nesting of [ ] and { } a spec may use."""
MAX_YAML_NODES = 100_000
"""Most values a YAML document may expand to, aliases counted each time they are used."""


def read_spec_file(path: Path) -> str:
    """The text of a spec file, or a SpecError naming the file (never an OSError)."""
    try:
        size = path.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise SpecError(
                [
                    FieldIssue(
                        "",
                        f"{path} is {size} bytes; a spec may be at most {MAX_SPEC_BYTES}",
                        "give the spec file, not a data file",
                    )
                ],
                source=str(path),
            )
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, UnicodeDecodeError):
            raise SpecError(
                [FieldIssue("", f"{path} is not UTF-8 text", "save the spec as UTF-8 YAML")],
                source=str(path),
            ) from exc
        raise SpecError(
            [FieldIssue("", f"cannot read {path}: {exc.strerror}", "check the path")],
            source=str(path),
        ) from exc


def load_yaml_text(text: str, *, source: str = "") -> Any:
    """Parse YAML (safe types only), turning syntax errors into a SpecError that points at
    the line. Refused as a SpecError: text over MAX_SPEC_BYTES, documents that expand to more
    than MAX_YAML_NODES values through aliases ("billion laughs"), recursive aliases, and
    nesting too deep to parse."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(
            [
                FieldIssue(
                    "",
                    f"the YAML text is {len(text)} characters; a spec may be at most "
                    f"{MAX_SPEC_BYTES}",
                    "give the spec, not a data file",
                )
            ],
            source=source,
        )
    if _flow_depth(text) > MAX_FLOW_DEPTH:
        raise SpecError(
            [
                FieldIssue(
                    "",
                    f"the YAML nests [ or {{ more than {MAX_FLOW_DEPTH} levels deep",
                    "flatten the document",
                )
            ],
            source=source,
        )
    try:  # the reader refuses control characters as soon as it is made
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        at = f"character {exc.position + 1}" if exc.position >= 0 else "an unknown position"
        char = exc.character
        what = f"U+{char:04X}" if isinstance(char, int) else repr(char)
        raise SpecError(
            [
                FieldIssue(
                    "",
                    f"the YAML holds the control character {what} at {at}",
                    "remove it: YAML allows printable characters, tabs and line breaks only",
                )
            ],
            source=source,
        ) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, source)
        return loader.construct_document(node)
    except RecursionError:
        raise SpecError(
            [FieldIssue("", "the YAML is nested too deeply", "flatten the document")],
            source=source,
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(
            [FieldIssue("", f"malformed YAML at {where}: {problem}", "fix the YAML syntax")],
            source=source,
        ) from exc
    finally:
        loader.dispose()


_FLOW_RE = re.compile(r"[\[\]{}]")
_QUOTED_RE = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|#[^\n]*")


def _flow_depth(text: str) -> int:
    """How deep [ ] and { } nest outside quotes and comments (PyYAML's scanner is slow on
    deep flow nesting, so it is refused before parsing)."""
    depth = deepest = 0
    for match in _FLOW_RE.finditer(_QUOTED_RE.sub("", text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth = max(0, depth - 1)
    return deepest


def _check_expansion(root: yaml.Node, source: str) -> None:
    """Count the values the document expands to (an alias counts its whole target each time
    it is used) without expanding it; refuse bombs and recursive aliases."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in visiting:
            raise SpecError(
                [FieldIssue("", "the YAML has a recursive alias", "write the values out")],
                source=source,
            )
        visiting.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        visiting.discard(key)
        if total > MAX_YAML_NODES:
            raise SpecError(
                [
                    FieldIssue(
                        "",
                        f"the YAML expands to more than {MAX_YAML_NODES} values "
                        "(aliases counted each time they are used)",
                        "write a smaller spec; do not nest aliases of aliases",
                    )
                ],
                source=source,
            )
        sizes[key] = total
        return total

    size(root)


_FIX_BY_TYPE = {
    "extra_forbidden": "remove this field or check its spelling",
    "missing": "add this field",
    "int_type": "give a whole number",
    "int_parsing": "give a whole number",
    "float_parsing": "give a number",
    "bool_parsing": "give true or false",
    "string_type": "give a string",
    "list_type": "give a list",
    "dict_type": "give a mapping of keys to values",
    "model_type": "give a mapping of fields",
    "greater_than_equal": "use a larger value",
    "greater_than": "use a larger value",
    "less_than_equal": "use a smaller value",
    "less_than": "use a smaller value",
    "literal_error": "use one of the allowed values",
    "enum": "use one of the allowed values",
    "string_too_short": "give a non-empty value",
    "string_pattern_mismatch": "use lowercase letters, digits and '-' (start with a letter)",
    "too_short": "give at least one item",
}


def spec_error_from_validation(exc: ValidationError, *, source: str = "") -> SpecError:
    """Translate pydantic's errors into FieldIssues with dotted paths and a fix each."""
    issues: list[FieldIssue] = []
    for err in exc.errors(include_url=False):
        path = ".".join(str(p) for p in err.get("loc", ()))
        kind = str(err.get("type", ""))
        message = str(err.get("msg", "invalid value"))
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        fix = _FIX_BY_TYPE.get(kind, "")
        if kind == "value_error" and "(fix:" in message:
            message, _, rest = message.partition(" (fix: ")
            fix = rest.rstrip(")")
        issues.append(FieldIssue(path, message, fix))
    return SpecError(issues, source=source)
