"""Metric names used by a PromQL expression, and the names rules and dashboards may use."""

from __future__ import annotations

import re

from tensoryard.observability import metrics as m

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "e",
}
# node_exporter metrics the rules and dashboards use beyond those the agent also exports
NODE_EXPORTER = {
    "node_filesystem_avail_bytes",
    "node_filesystem_size_bytes",
    "node_filesystem_readonly",
}
ALLOWED = m.names() | NODE_EXPORTER | {"up"}


def metric_names(expr: str) -> set[str]:
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\w+", " ", text)  # Grafana variables like $__rate_interval
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names
