"""Replicas as processes on this machine: the backend of the CPU engines (llama.cpp, mock).

Each replica is a process in its own session, its row (slot, port, pid) written before it is
spawned, restarted with a backoff when it exits, ready once the model answers a one-token
generation, and retired replica by replica in a rolling update (phases 3 to 5 of
:mod:`tensoryard.serving.replicas`). After a control-plane restart the rows lead back to live
processes, which are re-attached.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterable

from tensoryard.errors import NotFound
from tensoryard.serving.replica_state import (
    DeploymentState,
    Replica,
    Supervisor,
    alive,
    free_port,
    terminate,
)
from tensoryard.store._serving import RETIRING_SLOT, ReplicaRecord

__all__ = ["DRAIN_S", "MAX_BACKOFF_S", "LocalReplicas"]

log = logging.getLogger("tensoryard.serving")

MAX_BACKOFF_S = 30.0  # a replica that keeps crashing is restarted at most this rarely
DRAIN_S = 60.0  # a retiring replica still busy this long after the new ones are ready is stopped


class LocalReplicas:
    """The :class:`~tensoryard.serving.replica_state.ReplicaBackend` of local processes."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def adopt(self, dep: DeploymentState) -> None:
        """Re-attach to live replicas from the rows; rows of dead ones are dropped (and their
        replicas started again by the next reconcile)."""
        rec, store = dep.record, self.sup.store
        for row in store.list_replicas(rec.name):
            retiring = row.slot >= RETIRING_SLOT
            if row.pid is not None and alive(row.pid) and self.sup.answers(row.port):
                log.info("re-attached to replica %s/%d (pid %d)", rec.name, row.slot, row.pid)
                replica = Replica(
                    rec.name, row.slot, row.port, row.pid, ready=True, restarts=row.restarts
                )
                if retiring:  # a rolling update was under way: it goes on
                    dep.retiring[row.slot] = replica
                    continue
                dep.replicas[row.slot] = replica
                store.put_replica(rec.name, row.slot, port=row.port, state="ready", pid=row.pid)
            else:
                if retiring and row.pid is not None and alive(row.pid):
                    terminate(Replica(rec.name, row.slot, row.port, row.pid))
                store.remove_replica(rec.name, row.slot)  # started again below

    def roll(
        self,
        old: DeploymentState,
        new: DeploymentState,
        rows: dict[int, ReplicaRecord],
        leftover: list[Replica],
    ) -> None:
        """Ready old replicas whose rows the update moved to retiring slots keep serving; every
        other old process goes into ``leftover``."""
        for r in old.retiring.values():  # retiring since an earlier update: kept if its row is
            row = rows.get(r.slot)
            if row is not None and row.pid == r.pid and not r.exited():
                new.retiring[r.slot] = r
            else:
                leftover.append(r)
        for r in old.replicas.values():
            row = rows.get(RETIRING_SLOT + r.slot)
            if r.ready and row is not None and row.pid == r.pid and not r.exited():
                r.slot = RETIRING_SLOT + r.slot
                new.retiring[r.slot] = r
            else:
                leftover.append(r)

    def reconcile(self, dep: DeploymentState, target: int, now: float) -> None:
        rec = dep.record
        with self.sup.lock:  # surplus replicas get no new request and stop once they have none
            surplus = [
                dep.replicas.pop(s)
                for s in sorted(dep.replicas)
                if s >= target and dep.replicas[s].in_flight == 0
            ]
            missing = [s for s in range(target) if s not in dep.replicas]
        # 3. stop surplus, start missing
        for r in surplus:
            terminate(r)
            dep.router.forget(r.id)
            self.sup.store.remove_replica(rec.name, r.slot)
        for slot in missing:
            self._spawn(dep, slot, restarts=0)
        # 4. crashed -> restart; starting -> ready once it answers
        for r in list(dep.replicas.values()):
            if r.exited():
                if r.retry_at is None:  # just noticed: back off before the restart
                    delay = min(MAX_BACKOFF_S, 0.5 * 2 ** min(r.restarts, 10))
                    log.warning("replica %s exited; restarting it in %.1f s", r.id, delay)
                    with self.sup.lock:
                        r.ready = False
                        r.retry_at = now + delay
                    dep.router.forget(r.id)
                    self.sup.store.put_replica(
                        rec.name, r.slot, port=r.port, state="failed", pid=r.pid
                    )
                if now >= (r.retry_at or now):
                    self.sup.metrics.restarts.labels(rec.name).inc()
                    self._spawn(dep, r.slot, restarts=r.restarts + 1)
            elif not r.ready and self.sup.answers(r.port):
                with self.sup.lock:
                    r.ready = True
                    dep.last_request = max(dep.last_request, self.sup.clock())
                self.sup.store.put_replica(rec.name, r.slot, port=r.port, state="ready", pid=r.pid)
                log.info("replica %s ready on port %d", r.id, r.port)
        # 5. rolling update: stop the previous model's replicas once the new ones all answer
        if dep.retiring:
            self._retire(dep, target, now)

    def forget(self, dep: DeploymentState) -> None:
        for r in (*dep.replicas.values(), *dep.retiring.values()):
            terminate(r)

    def sweep(self, deployments: Iterable[str]) -> None:
        """Nothing to do: a deleted deployment's processes are stopped when it is forgotten."""

    def shutdown(self, deps: Iterable[DeploymentState]) -> None:
        with self.sup.lock:
            reps = [r for d in deps for r in (*d.replicas.values(), *d.retiring.values())]
        for r in reps:
            terminate(r)

    def _retire(self, dep: DeploymentState, target: int, now: float) -> None:
        with self.sup.lock:
            ready = sum(1 for r in dep.replicas.values() if r.ready)
            if ready < target:
                dep.drain_from = None  # (a new replica crashed meanwhile: keep serving)
                done: list[Replica] = [r for r in dep.retiring.values() if r.exited()]
            else:
                if dep.drain_from is None:
                    dep.drain_from = now
                    log.info(
                        "deployment %s: %d new replica(s) ready, retiring %d",
                        dep.record.name,
                        ready,
                        len(dep.retiring),
                    )
                late = now - dep.drain_from > DRAIN_S
                done = [r for r in dep.retiring.values() if r.in_flight == 0 or late]
            for r in done:
                dep.retiring.pop(r.slot, None)
        for r in done:
            terminate(r)
            dep.router.forget(r.id)
            self.sup.store.remove_replica(dep.record.name, r.slot)

    def _spawn(self, dep: DeploymentState, slot: int, *, restarts: int) -> None:
        rec, store = dep.record, self.sup.store
        port = free_port()
        # intent first: a control plane dying after this line finds the row and restarts it
        store.put_replica(rec.name, slot, port=port, state="starting", restarted=restarts > 0)
        argv = self.sup.command_for(rec, port)
        logs = self.sup.log_dir / rec.name
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"replica-{slot}.log").open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
        replica = Replica(rec.name, slot, port, popen.pid, popen, restarts=restarts)
        with self.sup.lock:  # known in memory before anything else can fail: stop() finds it
            dep.replicas[slot] = replica
        try:
            store.put_replica(rec.name, slot, port=port, state="starting", pid=popen.pid)
        except NotFound:  # the deployment was deleted while this replica started
            log.info(
                "deployment %s was deleted while replica %d started: stopping it", rec.name, slot
            )
            with self.sup.lock:
                if dep.replicas.get(slot) is replica:
                    del dep.replicas[slot]
            terminate(replica)
