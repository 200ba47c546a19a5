"""The one place tensoryard calls the official `kubernetes` client.

`connect` loads a kubeconfig (or the in-cluster identity), checks before anything is created
that the API server answers within the timeout, the namespace exists and this identity may do
every verb on every resource the executor uses (SelfSubjectAccessReview), and returns a `Kube`
whose calls raise ExecutorError naming the verb, the resource and the fix, never a client
exception.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tensoryard.errors import ExecutorError
from tensoryard.executors.kubernetes.config import KubernetesConfig

__all__ = ["JOBSET", "REQUIRED_ACCESS", "Kube", "KubeApiError", "connect"]

JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")

# (verb, group, resource, namespaced): exactly what the executor and the cluster view do;
# deploy/kubernetes/rbac.yaml grants these and nothing else.
REQUIRED_ACCESS: tuple[tuple[str, str, str, bool], ...] = (
    *((v, "", "nodes", False) for v in ("get", "list", "watch")),
    ("patch", "", "nodes", False),  # cordon mirrored onto the Node (config.cordon_nodes)
    *((v, "", "pods", False) for v in ("list", "watch")),
    *((v, "", "pods", True) for v in ("get", "delete", "deletecollection")),
    ("get", "", "pods/log", True),
    *((v, "", "secrets", True) for v in ("get", "list", "create", "patch", "delete")),
    *((v, "", "services", True) for v in ("get", "list", "create", "delete")),
    *((v, "batch", "jobs", True) for v in ("get", "list", "watch", "create", "delete")),
    *(
        (v, "jobset.x-k8s.io", "jobsets", True)
        for v in ("get", "list", "watch", "create", "delete")
    ),
    ("get", "", "persistentvolumeclaims", True),  # the runs claim and jobs' volumes exist
    ("list", "", "events", True),  # why a Job cannot create its pods (FailedCreate)
    ("update", "batch", "jobs/finalizers", True),
    ("update", "jobset.x-k8s.io", "jobsets/finalizers", True),
    # model serving on GPUs (serving/kubernetes.py): a Deployment or LeaderWorkerSet each
    *((v, "apps", "deployments", True) for v in ("get", "list", "create", "update", "delete")),
    *(
        (v, "leaderworkerset.x-k8s.io", "leaderworkersets", True)
        for v in ("get", "list", "create", "update", "delete")
    ),
)


class KubeApiError(ExecutorError):
    """An API call failed; `status` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Kube:
    """A connected client: the API groups tensoryard uses plus the call guard."""

    api: Any  # kubernetes.client.ApiClient
    config: KubernetesConfig
    server: str

    def __post_init__(self) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.calls = 0  # API calls made (the benchmark reports calls per job)

    @property
    def timeout(self) -> tuple[float, float]:
        t = self.config.request_timeout_s
        return (t, t)

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call `fn` with the timeout; translate failures into KubeApiError naming `what`
        (like "create jobsets.jobset.x-k8s.io in namespace ns")."""
        with self.translated(what):
            self.calls += 1
            return fn(*args, _request_timeout=self.timeout, **kwargs)

    def plain(self, obj: Any) -> Any:
        """A client model as the API's JSON (camelCase keys), for the pure mappers."""
        return self.api.sanitize_for_serialization(obj)

    @contextmanager
    def translated(self, what: str) -> Iterator[None]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            yield
        except ApiException as exc:
            raise KubeApiError(_api_message(what, exc, self), int(exc.status or 0)) from exc
        except (HTTPError, OSError) as exc:
            raise KubeApiError(
                f"cannot reach the Kubernetes API server at {self.server} to {what} "
                f"(timeout {self.config.request_timeout_s:g}s): {exc} (fix: check the "
                "kubeconfig's server address and that the API server is up)",
                0,
            ) from exc


def _api_message(what: str, exc: Any, kube: Kube) -> str:
    try:
        detail = json.loads(exc.body or "{}").get("message") or exc.reason
    except (TypeError, ValueError):
        detail = exc.reason
    if exc.status == 403 and "exceeded quota" in str(detail):
        return (
            f"Kubernetes refused to {what}: {detail} (fix: raise the namespace's ResourceQuota "
            "or wait for running jobs to end)"
        )
    if exc.status == 403:
        return (
            f"Kubernetes refused to {what}: {detail} (fix: grant the control plane's identity "
            "the role in deploy/kubernetes/rbac.yaml)"
        )
    if exc.status == 401:
        return (
            f"Kubernetes did not accept the credentials to {what} "
            "(fix: renew the kubeconfig's token)"
        )
    return f"cannot {what}: HTTP {exc.status} {detail}"


def _load(config: KubernetesConfig) -> Any:
    from kubernetes import client
    from kubernetes import config as kconfig
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if config.kubeconfig is None:
            try:
                kconfig.load_kube_config(  # type: ignore[no-untyped-call]
                    context=config.context, client_configuration=configuration
                )
            except (ConfigException, OSError):
                kconfig.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
        else:
            if not config.kubeconfig.is_file():
                raise ExecutorError(
                    f"kubeconfig {config.kubeconfig} does not exist (fix: --kubeconfig PATH)"
                )
            kconfig.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(config.kubeconfig),
                context=config.context,
                client_configuration=configuration,
            )
    except ConfigException as exc:
        raise ExecutorError(
            f"cannot load the Kubernetes configuration ({exc}) (fix: pass --kubeconfig PATH, "
            "set KUBECONFIG, or run in a pod with a ServiceAccount)"
        ) from exc
    configuration.retries = 0  # fail fast; the control loop retries on its own schedule
    return client.ApiClient(configuration)


def connect(config: KubernetesConfig, *, check_access: bool = True) -> Kube:
    """A client for `config`, checked: reachable, namespace present, access granted."""
    api = _load(config)
    kube = Kube(api=api, config=config, server=str(api.configuration.host))
    from kubernetes import client

    kube.call("read the API server version", client.VersionApi(api).get_code)
    try:
        kube.call(f"read namespace {config.namespace}", kube.core.read_namespace, config.namespace)
    except KubeApiError as exc:
        if exc.status == 404:
            raise ExecutorError(
                f"namespace {config.namespace!r} does not exist (fix: `kubectl create namespace "
                f"{config.namespace}` or pass --namespace)"
            ) from exc
        if exc.status != 403:  # reading namespaces is not granted by the shipped role
            raise
    if check_access:
        missing = missing_access(kube)
        if missing:
            raise ExecutorError(
                "the control plane's Kubernetes identity may not "
                + "; ".join(missing)
                + " (fix: apply deploy/kubernetes/rbac.yaml and run as its ServiceAccount)"
            )
    if config.runs_claim:
        check_runs_claim(kube)
    return kube


def check_runs_claim(kube: Kube) -> None:
    """ExecutorError unless the runs claim exists in the namespace (pods would wait forever
    for it: the scheduler only says it is missing)."""
    name, ns = kube.config.runs_claim, kube.config.namespace
    try:
        kube.call(
            f"get persistentvolumeclaims in namespace {ns}",
            kube.core.read_namespaced_persistent_volume_claim,
            name,
            ns,
        )
    except KubeApiError as exc:
        if exc.status != 404:
            raise
        raise ExecutorError(
            f"--runs-claim {name}: no PersistentVolumeClaim {name!r} in namespace {ns} (fix: "
            f"create a ReadWriteMany claim named {name} there and mount it at the control "
            "plane's runs directory; see docs/kubernetes.md)"
        ) from exc


def claim_phase(kube: Kube, name: str) -> str | None:
    """The phase of PersistentVolumeClaim `name` in the namespace (Bound, Pending, Lost), or
    None when there is none."""
    ns = kube.config.namespace
    try:
        claim = kube.call(
            f"get persistentvolumeclaims in namespace {ns}",
            kube.core.read_namespaced_persistent_volume_claim,
            name,
            ns,
        )
    except KubeApiError as exc:
        if exc.status == 404:
            return None
        raise
    status = getattr(claim, "status", None)
    return str(getattr(status, "phase", None) or "Pending")


def check_volumes(kube: Kube, claims: Sequence[str]) -> list[tuple[int, str, str]]:
    """(index, problem, fix) for each of a job's volume claims that pods could not mount: one
    that does not exist (its pods would wait forever, the scheduler saying only that it is
    missing) or one whose volume is lost. A Pending claim is fine: many storage classes bind
    on the first pod (WaitForFirstConsumer)."""
    ns = kube.config.namespace
    problems = []
    for i, name in enumerate(claims):
        phase = claim_phase(kube, name)
        if phase is None:
            problems.append(
                (
                    i,
                    f"no PersistentVolumeClaim {name!r} in namespace {ns}",
                    f"create it, or name one that `kubectl get pvc -n {ns}` lists",
                )
            )
        elif phase == "Lost":
            problems.append(
                (
                    i,
                    f"PersistentVolumeClaim {name!r} in namespace {ns} has lost its volume",
                    "restore its PersistentVolume, or create the claim again",
                )
            )
    return problems


def missing_access(kube: Kube) -> list[str]:
    """Each "VERB RESOURCE[ in namespace NS]" of REQUIRED_ACCESS this identity lacks."""
    from kubernetes import client

    authz = client.AuthorizationV1Api(kube.api)
    missing = []
    for verb, group, resource, namespaced in REQUIRED_ACCESS:
        if group == JOBSET[0] and kube.config.workload == "job":
            continue
        if (verb, resource) == ("patch", "nodes") and not kube.config.cordon_nodes:
            continue
        sub, _, subresource = resource.partition("/")
        attrs: dict[str, Any] = {"verb": verb, "group": group, "resource": sub}
        if subresource:
            attrs["subresource"] = subresource
        if namespaced:
            attrs["namespace"] = kube.config.namespace
        review = kube.call(
            "create selfsubjectaccessreviews.authorization.k8s.io",
            authz.create_self_subject_access_review,
            {"spec": {"resourceAttributes": attrs}},
        )
        if not review.status.allowed:
            full = f"{resource}.{group}" if group else resource
            where = f" in namespace {kube.config.namespace}" if namespaced else " (cluster-wide)"
            missing.append(f"{verb} {full}{where}")
    return missing
