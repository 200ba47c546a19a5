"""The HTTP building blocks that the control plane, the serving plane and the console share.

The access model (who may do what), the request guard (authentication, authorization, the
audit context), request limits and the node telemetry book sit here, below ``server``,
``serving`` and ``console``, so that each of those mounts its routes on the same guard while
every import runs downward: ``server`` composes ``serving`` and ``console``; neither of them
imports ``server``.
"""
