"""Alembic environment for the tensoryard store.

Configured in code by ``tensoryard.store._db.alembic_config``: the store passes an open
connection in ``config.attributes["connection"]``; without one the ``sqlalchemy.url`` option is
used (online) or SQL is printed (offline, ``--sql``).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from tensoryard.store.models import Base

config = context.config
target_metadata = Base.metadata


def run_offline() -> None:
    """Emit SQL for a DBA to apply by hand."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Migrate through the store's connection (or one made from sqlalchemy.url)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url or pass a connection in config.attributes")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            _migrate(conn)
            conn.commit()
    finally:
        engine.dispose()


def _migrate(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite can only ALTER through table copies
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
