"""The Kubernetes executor: attempts run as JobSets (or Indexed Jobs) on GPU nodes.

`manifests` renders the objects (pure, no client); the executor that creates and watches them
follows the executor protocol in `tensoryard.executors.base`.
"""
