"""A list-then-watch cache of one kind of object (what client-go calls a reflector + store).

    LIST (label/field selector) ──> objects by name, resourceVersion R
    WATCH from R, with bookmarks ──> ADDED / MODIFIED / DELETED applied; BOOKMARK moves R on
    410 Gone (R was compacted away) ──> LIST again, then WATCH from the new R

One background thread per cache. Readers get a consistent copy of the objects (the API's JSON
dicts) once the first LIST has landed (`synced`); before that, or when the watch broke and has
not recovered, callers fall back to a direct LIST. The executor keeps two (its pods, its
JobSets or Jobs), so a poll costs no API call while the watches are healthy.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from tensoryard.executors.kubernetes.client import Kube
from tensoryard.executors.kubernetes.status import Obj, get

__all__ = ["WatchCache", "raw_watch"]

log = logging.getLogger("tensoryard.executors.kubernetes")

_GONE = 410


class WatchCache:
    """Objects returned by `list_fn(*args, label_selector=..., field_selector=...)`, kept
    current by a watch. `relists` counts LISTs (1 after the first sync; +1 per 410)."""

    def __init__(
        self,
        kube: Kube,
        what: str,
        list_fn: Callable[..., Any],
        *args: Any,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout_s: int = 60,
        retry_s: float = 1.0,
        index: Callable[[Obj], Iterable[str]] | None = None,
    ) -> None:
        self.kube = kube
        self.what = what
        self.list_fn = list_fn
        self.args = args
        self.selectors = {
            k: v
            for k, v in (("label_selector", label_selector), ("field_selector", field_selector))
            if v
        }
        self.watch_timeout_s = watch_timeout_s
        self.retry_s = retry_s
        self.synced = threading.Event()
        self.healthy = False  # the watch is running (not between an error and a relist)
        self.resource_version: str | None = None
        self.relists = 0
        self.bookmarks = 0
        self._objects: dict[str, Obj] = {}
        # `index(obj)` -> keys; key -> name -> object, kept with the objects (`indexed`): a poll
        # per attempt must not scan every object of the namespace
        self._index_fn = index
        self._index: dict[str, dict[str, Obj]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name=f"watch {what}", daemon=True)
        # called with (event type, object) after each change is applied, from the watch's
        # thread ("RELIST", {} after a relist: anything may have changed)
        self.listeners: list[Callable[[str, Obj], None]] = []

    # -- readers ------------------------------------------------------------------------------

    def ready(self) -> bool:
        return self.synced.is_set() and self.healthy

    def get(self, name: str) -> Obj | None:
        with self._lock:
            return self._objects.get(name)

    def select(self, label: str, value: str) -> list[Obj]:
        with self._lock:
            return [o for o in self._objects.values() if _labels(o).get(label) == value]

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._objects.values())

    def indexed(self, key: str) -> list[Obj]:
        """The objects whose `index` keys include `key` (needs `index`)."""
        with self._lock:
            return list(self._index.get(key, {}).values())

    def _add_to_index(self, name: str, obj: Obj) -> None:
        if self._index_fn is not None:
            for key in self._index_fn(obj):
                self._index.setdefault(key, {})[name] = obj

    def _drop_from_index(self, name: str, obj: Obj) -> None:
        if self._index_fn is not None:
            for key in self._index_fn(obj):
                bucket = self._index.get(key)
                if bucket is not None:
                    bucket.pop(name, None)
                    if not bucket:
                        del self._index[key]

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, *, wait_s: float = 10.0) -> WatchCache:
        self._thread.start()
        self.synced.wait(wait_s)
        return self

    def stop(self) -> None:
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.stop()
        self._thread.join(timeout=5)

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._relist()
                self._watch_once()
            except ApiException as exc:
                self.healthy = False
                if exc.status == _GONE:
                    log.info("watch %s: resourceVersion too old (410 Gone): relisting", self.what)
                    self.resource_version = None
                    continue
                log.warning("watch %s failed (%s); retrying in %gs", self.what, exc, self.retry_s)
                self._stop.wait(self.retry_s)
            except (HTTPError, OSError, ValueError) as exc:
                self.healthy = False
                if self._stop.is_set():
                    continue  # we closed the stream ourselves
                log.warning("watch %s broke (%s); retrying in %gs", self.what, exc, self.retry_s)
                self._stop.wait(self.retry_s)

    def _relist(self) -> None:
        result = self.list_fn(
            *self.args,
            _request_timeout=self.kube.timeout,
            _preload_content=False,  # the JSON as it came: no client models built and undone
            **self.selectors,
        )
        raw = _json_of(result, self.kube)
        objects = {str(get(o, "metadata", "name")): o for o in raw.get("items") or []}
        with self._lock:
            self._objects = objects
            self._index = {}
            for name, obj in objects.items():
                self._add_to_index(name, obj)
        self.resource_version = str(get(raw, "metadata", "resourceVersion"))
        self.relists += 1
        self.synced.set()
        self._tell("RELIST", {})

    def _watch_once(self) -> None:
        self._watch = raw_watch()
        self.healthy = True
        read_timeout = self.watch_timeout_s + self.kube.config.request_timeout_s
        stream = self._watch.stream(
            self.list_fn,
            *self.args,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s,
            _request_timeout=(self.kube.config.request_timeout_s, read_timeout),
            **self.selectors,
        )
        started = time.monotonic()
        for event in stream:
            if self._stop.is_set():
                break
            self._apply(str(event["type"]), event["raw_object"])
        self._watch = None
        log.debug("watch %s: stream ended after %.0fs", self.what, time.monotonic() - started)

    def _apply(self, kind: str, obj: Obj) -> None:
        version = get(obj, "metadata", "resourceVersion")
        if version:
            self.resource_version = str(version)
        if kind == "BOOKMARK":
            self.bookmarks += 1
            return
        name = str(get(obj, "metadata", "name"))
        with self._lock:
            old = self._objects.get(name)
            if old is not None:
                self._drop_from_index(name, old)
            if kind == "DELETED":
                self._objects.pop(name, None)
            else:
                self._objects[name] = obj
                self._add_to_index(name, obj)
        self._tell(kind, obj)

    def _tell(self, kind: str, obj: Obj) -> None:
        for listener in list(self.listeners):
            try:
                listener(kind, obj)
            except Exception:  # a listener must not stop the watch
                log.exception("watch %s: listener failed", self.what)


def _json_of(result: Any, kube: Any) -> Obj:
    """A LIST's answer as the API's JSON: the body of a raw response (``_preload_content=False``),
    or a client model (or a test's plain dict) through `kube.plain`."""
    data = getattr(result, "data", None)
    if isinstance(data, bytes | bytearray):
        decoded: Obj = json.loads(data)
        return decoded
    plain: Obj = kube.plain(result)
    return plain


def raw_watch() -> Any:
    """A kubernetes Watch whose events carry only the JSON (``raw_object``, all this cache
    uses). The stock Watch also builds the client's model object of every event (a V1Pod from
    ``json.dumps`` of the JSON just parsed): 11-19x the CPU per pod event
    (benchmarks/k8s_watch_events.py), found profiling the Kueue benchmark."""
    return _raw_watch_class()()


@functools.cache
def _raw_watch_class() -> Any:
    from kubernetes import watch  # imported on first use: the client is an optional extra

    class RawWatch(watch.Watch):  # type: ignore[misc]
        def get_return_type(self, func: Any) -> None:
            return None  # unmarshal_event then keeps the parsed JSON only

    return RawWatch


def _labels(obj: Obj) -> dict[str, str]:
    return dict(get(obj, "metadata", "labels") or {})
