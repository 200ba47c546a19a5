"""The leader lease and the fencing checks: one replica leads the control loop at a time.

The lease is taken and renewed through the plain store; everything else the loop writes goes
through a fenced view of it (``Store.fenced(fence_token, on_fenced=fenced_out)``), so a
deposed leader can change no row (docs/state-machine.md, "Fencing"), and `check_fence` is
called before each side effect outside the database."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from tensoryard.errors import FencedOut, StoreError, TensoryardError
from tensoryard.server.config import ServerConfig
from tensoryard.server.control.rules import LEADER_LEASE
from tensoryard.server.metrics import LoopMetrics
from tensoryard.store import AuditContext, Fence, Store

__all__ = ["Leadership"]

log = logging.getLogger("tensoryard.controller")


class Leadership:
    """This replica's hold on the leader lease: whether it leads, at which epoch, and when it
    last renewed; `cycle_done` is set by the loop after each completed cycle."""

    def __init__(
        self,
        *,
        lease_store: Store,
        holder: str,
        config: ServerConfig,
        clock: Callable[[], float],
        metrics: LoopMetrics,
    ) -> None:
        self.holder = holder
        self._lease_store = lease_store
        self._config = config
        self._clock = clock
        self._metrics = metrics
        self.is_leader = False
        self.epoch: int | None = None
        self._renewed = 0.0
        self.cycle_done = float("-inf")  # when the last cycle completed (clock())

    def lead(self) -> tuple[bool, bool]:
        """Take or renew the lease: (leading now, just took it: the caller recovers).

        The leader renews when a third of the TTL has passed (not every cycle)."""
        now = self._clock()
        if self.is_leader and 0 <= now - self._renewed < self._config.lease_ttl_s / 3:
            return True, False
        epoch = self._lease_store.acquire_lease(
            LEADER_LEASE,
            self.holder,
            self._config.lease_ttl_s,
            epoch=self.epoch if self.is_leader else None,  # a long cycle is no change of leader
        )
        self._renewed = now
        if epoch is None:
            if self.is_leader:
                self._step_down("lost the leader lease to another replica")
            return False, False
        if not self.is_leader or epoch != self.epoch:
            log.info("leading the control loop (holder %s, epoch %d)", self.holder, epoch)
            self.is_leader, self.epoch = True, epoch
            self._metrics.leader_change(self.holder, leading=True, epoch=self.epoch)
            self._audit("leader.take", self.epoch, "took the leader lease")
            return True, True
        return True, False

    def release(self) -> None:
        with contextlib.suppress(StoreError):
            self._lease_store.release_lease(LEADER_LEASE, self.holder)

    def leading_now(self) -> bool:
        """What /healthz reports: the lease is held (renewed within its TTL, by this process's
        clock) and the loop completed a cycle within the TTL. A replica that was paused, or
        whose loop is stuck, stops claiming the lead before another can take it."""
        if not self.is_leader:
            return False
        now, ttl = self._clock(), self._config.lease_ttl_s
        return now - self._renewed < ttl and now - self.cycle_done < ttl

    # ---- fencing ---------------------------------------------------------------------------

    def fence_token(self) -> Fence | None:
        """The fencing token every write of the loop carries: the lease at our epoch."""
        if not self.is_leader or self.epoch is None:
            return None
        return Fence(LEADER_LEASE, self.holder, self.epoch, self._config.lease_ttl_s)

    def fenced_out(self, why: str) -> None:
        """A fenced write found the lease moved on: step down at once."""
        if self.is_leader:
            self._step_down(f"a write was refused: {why}")

    def check_fence(self) -> None:
        """Before a side effect outside the database (launch, cancel, terminate): this replica
        still holds the lease at its epoch, read from the database now; FencedOut otherwise.
        The write that recorded the intent was fenced too, so a replica paused between the two
        finds out here, and the attempt key keeps a second launch from starting twice."""
        token = self.fence_token()
        if token is None:
            raise FencedOut("this replica does not lead the control loop; nothing was started")
        found = self._lease_store.lease_holder(LEADER_LEASE)
        if found is None or (found[0], found[1]) != (token.holder, token.epoch):
            now = "nobody" if found is None else f"{found[0]} at epoch {found[1]}"
            why = f"the lease moved on to {now}; no side effect was performed"
            self.fenced_out(why)
            raise FencedOut(why)

    def _step_down(self, why: str) -> None:
        log.warning("stepping down (holder %s, epoch %s): %s", self.holder, self.epoch, why)
        epoch, self.is_leader, self.epoch = self.epoch, False, None
        self._metrics.leader_change(self.holder, leading=False)
        self._audit("leader.step-down", epoch, why)

    def _audit(self, action: str, epoch: int | None, why: str) -> None:
        """Each change of leader in the audit log (append-only), with the epoch."""
        with contextlib.suppress(TensoryardError):
            self._lease_store.record_audit(
                AuditContext(actor=f"replica/{self.holder}", source_ip=""),
                action,
                f"lease/{LEADER_LEASE}",
                detail=f"epoch {epoch}: {why}",
            )
