"""Model serving: deployments of GGUF models on llama.cpp replicas behind one
OpenAI-compatible gateway with prefix-cache-aware routing (docs/serving.md)."""

from tensoryard.serving.router import PrefixAwareRouter, ReplicaLoad, RoundRobinRouter, Router
from tensoryard.serving.source import ModelSource, parse_model_source

__all__ = [
    "ModelSource",
    "PrefixAwareRouter",
    "ReplicaLoad",
    "RoundRobinRouter",
    "Router",
    "parse_model_source",
]
