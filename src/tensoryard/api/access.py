"""Who may do what: principals, roles, scopes and the one rule table of the API.

Pure (no I/O). A user token resolves to a :class:`Principal`: the user's platform-admin flag,
their role in each team and the token's scopes. :func:`authorize` checks one action against
the rule table and raises :class:`Forbidden` with a message that says what is missing and who
can grant it. Job tokens never become principals: they only authenticate the report endpoint
of their own job and attempt (see ``app.py``).

Roles per team, weakest first: viewer (read) < member (submit, cancel) < team-admin (manage the
team's members). Platform admins may do everything, including what no team role allows:
create teams, set quotas, create users, read the audit log.

:data:`ROUTE_ACCESS` declares, for every route of the control plane's app, who may call it
(:class:`Access`); ``tests/integration/server/test_server_access_matrix.py`` fails on a route
without a declaration and calls every route as every kind of caller against it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from tensoryard.errors import Forbidden
from tensoryard.store import TEAM_ROLES, TOKEN_SCOPES, TokenRecord, UserRecord

__all__ = [
    "JOB_EVENT_KINDS",
    "ROUTE_ACCESS",
    "RULES",
    "Access",
    "Action",
    "Caller",
    "Principal",
    "Rule",
    "authorize",
    "principal_of",
    "route_keys",
]

JOB_EVENT_KINDS = frozenset({"runtime", "log", "progress", "warning", "error", "checkpoint"})
"""The event kinds a job token may post; the control plane's own kinds (state, cancel,
submitted, preempt...) are never accepted from a job."""


class Action(StrEnum):
    JOB_READ = "job.read"
    JOB_SUBMIT = "job.submit"
    JOB_CANCEL = "job.cancel"
    JOB_REPORT = "job.report"
    TEAM_READ = "team.read"
    TEAM_CREATE = "team.create"
    TEAM_UPDATE = "team.update"
    MEMBER_READ = "team.member.read"
    MEMBER_MANAGE = "team.member.set"
    USER_READ = "user.read"
    USER_CREATE = "user.create"
    TOKEN_READ_OWN = "token.read"
    TOKEN_MANAGE_OWN = "token.manage"
    TOKEN_MANAGE_ANY = "token.manage-any"
    AUDIT_READ = "audit.read"
    METRICS_READ = "metrics.read"
    SECRET_READ = "secret.read"
    SECRET_MANAGE = "secret.set"
    MODEL_READ = "model.read"
    MODEL_WRITE = "model.write"
    NODE_READ = "node.read"
    NODE_MANAGE = "node.manage"
    ARTIFACT_GC = "artifact.gc"
    WEBHOOK_READ = "webhook.read"
    WEBHOOK_MANAGE = "webhook.manage"


@dataclass(frozen=True)
class Rule:
    """What an action needs: a token scope, and either a team role (in the object's team),
    platform admin (``role=None, anyone=False``) or nothing more (``anyone=True``)."""

    scope: str
    verb: str
    role: str | None = None
    anyone: bool = False


RULES: dict[Action, Rule] = {
    Action.JOB_READ: Rule("read", "see this team's jobs", role="viewer"),
    Action.JOB_SUBMIT: Rule("write", "submit jobs to this team", role="member"),
    Action.JOB_CANCEL: Rule("write", "cancel this team's jobs", role="member"),
    Action.JOB_REPORT: Rule("admin", "report for a job without its job token"),
    Action.TEAM_READ: Rule("read", "list teams", anyone=True),
    Action.TEAM_CREATE: Rule("admin", "create teams"),
    Action.TEAM_UPDATE: Rule("admin", "change a team's quotas"),
    Action.MEMBER_READ: Rule("read", "see this team's members", role="viewer"),
    Action.MEMBER_MANAGE: Rule("admin", "manage this team's members", role="team-admin"),
    Action.USER_READ: Rule("admin", "list users"),
    Action.USER_CREATE: Rule("admin", "create users"),
    Action.TOKEN_READ_OWN: Rule("read", "list your tokens", anyone=True),
    Action.TOKEN_MANAGE_OWN: Rule("write", "create or revoke your tokens", anyone=True),
    Action.TOKEN_MANAGE_ANY: Rule("admin", "manage other users' tokens"),
    Action.METRICS_READ: Rule("read", "scrape the platform metrics"),
    Action.SECRET_READ: Rule("read", "list this team's secret names", role="member"),
    Action.SECRET_MANAGE: Rule("write", "set or delete this team's secrets", role="team-admin"),
    Action.AUDIT_READ: Rule("admin", "read the audit log"),
    Action.MODEL_READ: Rule("read", "see this team's models", role="viewer"),
    Action.MODEL_WRITE: Rule("write", "register versions and move aliases", role="member"),
    Action.NODE_READ: Rule("read", "list nodes and their history", anyone=True),
    Action.NODE_MANAGE: Rule("admin", "cordon, drain or uncordon nodes and report node health"),
    Action.ARTIFACT_GC: Rule("admin", "garbage-collect the artifact store"),
    Action.WEBHOOK_READ: Rule("read", "list webhook deliveries"),
    Action.WEBHOOK_MANAGE: Rule("write", "redeliver webhook deliveries"),
}


@dataclass(frozen=True)
class Principal:
    """An authenticated user acting through one token."""

    name: str
    platform_admin: bool
    token_id: str
    scopes: frozenset[str] = frozenset(TOKEN_SCOPES)
    roles: dict[str, str] = field(default_factory=dict)  # team -> role

    def role_in(self, team: str) -> str | None:
        return self.roles.get(team)

    def visible_teams(self) -> list[str] | None:
        """Teams whose jobs this principal may see (None: every team)."""
        return None if self.platform_admin else sorted(self.roles)


def principal_of(user: UserRecord, token: TokenRecord) -> Principal:
    return Principal(
        name=user.name,
        platform_admin=user.platform_admin,
        token_id=token.id,
        scopes=frozenset(token.scopes),
        roles=dict(user.teams),
    )


def _rank(role: str | None) -> int:
    return -1 if role is None else TEAM_ROLES.index(role)


def authorize(who: Principal, action: Action, team: str | None = None) -> None:
    """Return if ``who`` may do ``action`` (on an object of ``team``), else raise Forbidden."""
    rule = RULES[action]
    if rule.scope not in who.scopes:
        raise Forbidden(
            f"token {who.token_id} lacks the '{rule.scope}' scope needed to {rule.verb} "
            f"(fix: use a token with it, e.g. `tyard tokens create --scope {rule.scope}`)"
        )
    if who.platform_admin or rule.anyone:
        return
    if rule.role is None or team is None:
        raise Forbidden(
            f"only platform admins may {rule.verb}; {who.name} is not one "
            "(ask a platform admin to do it)"
        )
    have = who.role_in(team)
    if _rank(have) >= _rank(rule.role):
        return
    standing = f"is {have} in team '{team}'" if have else f"is not a member of team '{team}'"
    raise Forbidden(
        f"{who.name} {standing}; to {rule.verb} needs the role {rule.role} or higher "
        f"(a team-admin of '{team}' or a platform admin can grant it: "
        f"`tyard teams members add {team} {who.name} --role {rule.role}`)"
    )


# ---- who may call each route -----------------------------------------------------------------


class Caller(StrEnum):
    """A kind of caller, relative to the object a route acts on (its team, its job)."""

    ANONYMOUS = "anonymous"  # no valid token: none, unknown, expired or revoked
    JOB = "job"  # the job token of the route's own job, for its current attempt
    USER = "user"  # any signed-in user, also one with no role in the object's team
    VIEWER = "viewer"
    MEMBER = "member"
    TEAM_ADMIN = "team-admin"
    PLATFORM_ADMIN = "platform-admin"


_USER_RANK = (Caller.USER, Caller.VIEWER, Caller.MEMBER, Caller.TEAM_ADMIN, Caller.PLATFORM_ADMIN)


@dataclass(frozen=True)
class Access:
    """Who may call one route.

    ``least`` is the weakest caller allowed; every stronger user is allowed too. A team role
    (viewer, member, team-admin) means that role or a higher one *in the team of the route's
    object* (the path's job, team, pipeline, model or deployment, or the body's team), so the
    members of other teams are refused with 403. A caller without a valid token gets 401
    everywhere but on public routes (``least=ANONYMOUS``); a job token works only where
    ``job_token`` says so, and is 401 elsewhere."""

    least: Caller
    scope: str | None = None  # the token scope it checks; None: any valid token will do
    job_token: bool = False  # also the job token of the path's job
    owner: bool = False  # also the owner of the path's object (a token's user)
    note: str = ""

    def __post_init__(self) -> None:
        if self.least is Caller.JOB:
            raise ValueError("a route open to job tokens says job_token=True, not least=JOB")

    def admits(self, caller: Caller, *, owner: bool = False) -> bool:
        """Whether ``caller`` may call the route (``owner``: it owns the path's object)."""
        if self.least is Caller.ANONYMOUS:
            return True
        if caller is Caller.JOB:
            return self.job_token
        if caller is Caller.ANONYMOUS:
            return False
        if owner and self.owner:
            return True
        return _USER_RANK.index(caller) >= _USER_RANK.index(self.least)


_PUBLIC = Access(Caller.ANONYMOUS)
_ANY, _VIEWER, _MEMBER = Caller.USER, Caller.VIEWER, Caller.MEMBER
_TEAM_ADMIN, _ADMIN = Caller.TEAM_ADMIN, Caller.PLATFORM_ADMIN
_MINE = "lists only the objects of the caller's teams (every team for platform admins)"
_MINE_OR_TEAM = _MINE + "; ?team= needs viewer in that team"

ROUTE_ACCESS: dict[tuple[str, str], Access] = {
    # public
    ("GET", "/healthz"): _PUBLIC,
    ("GET", "/openapi.json"): _PUBLIC,
    ("GET", "/docs"): _PUBLIC,
    ("GET", "/docs/oauth2-redirect"): _PUBLIC,
    ("GET", "/redoc"): _PUBLIC,
    ("GET", "/"): Access(Caller.ANONYMOUS, note="the console's page; its data needs a token"),
    ("GET", "/ui/{path:path}"): Access(Caller.ANONYMOUS, note="the console's static files"),
    # jobs
    ("POST", "/api/v1/jobs"): Access(_MEMBER, "write", note="in the spec's team"),
    ("POST", "/api/v1/jobs/batch"): Access(_MEMBER, "write", note="in each spec's team"),
    ("GET", "/api/v1/jobs"): Access(_ANY, note=_MINE_OR_TEAM),
    ("GET", "/api/v1/jobs/{job_id}"): Access(_VIEWER, "read"),
    ("POST", "/api/v1/jobs/{job_id}/cancel"): Access(_MEMBER, "write"),
    ("GET", "/api/v1/jobs/{job_id}/attempts"): Access(_VIEWER, "read"),
    ("GET", "/api/v1/jobs/{job_id}/events"): Access(_VIEWER, "read"),
    ("GET", "/api/v1/jobs/{job_id}/metrics"): Access(_VIEWER, "read"),
    ("GET", "/api/v1/jobs/{job_id}/checkpoints"): Access(_VIEWER, "read"),
    ("GET", "/api/v1/jobs/{job_id}/ranks"): Access(_VIEWER, "read"),
    ("GET", "/api/v1/jobs/{job_id}/checkpoint-removals"): Access(_VIEWER, "read"),
    ("GET", "/api/v1/jobs/{job_id}/summary"): Access(_VIEWER, "read"),
    ("GET", "/api/v1/jobs/{job_id}/logs"): Access(_VIEWER, "read"),
    ("POST", "/api/v1/jobs/{job_id}/report"): Access(
        _ADMIN, "admin", job_token=True, note="a job token for its own attempt only"
    ),
    ("POST", "/api/v1/jobs/{job_id}/resubmit"): Access(_MEMBER, "write"),
    ("GET", "/api/v1/jobs/{job_id}/stream"): Access(_VIEWER, "read"),
    ("GET", "/api/v1/jobs/{job_id}/logs/stream"): Access(_VIEWER, "read"),
    # teams, users, members, tokens, audit
    ("GET", "/api/v1/teams"): Access(_ANY, "read"),
    ("POST", "/api/v1/teams"): Access(_ADMIN, "admin"),
    ("PATCH", "/api/v1/teams/{name}"): Access(_ADMIN, "admin"),
    ("GET", "/api/v1/teams/{name}/goodput"): Access(_VIEWER, "read"),
    ("GET", "/api/v1/users/me"): Access(_ANY),
    ("GET", "/api/v1/users"): Access(_ADMIN, "admin"),
    ("POST", "/api/v1/users"): Access(_ADMIN, "admin"),
    ("GET", "/api/v1/teams/{team}/members"): Access(_VIEWER, "read"),
    ("PUT", "/api/v1/teams/{team}/members/{user}"): Access(_TEAM_ADMIN, "admin"),
    ("DELETE", "/api/v1/teams/{team}/members/{user}"): Access(_TEAM_ADMIN, "admin"),
    ("GET", "/api/v1/tokens"): Access(_ANY, "read", note="own; ?user= or ?all= platform admins"),
    ("POST", "/api/v1/tokens"): Access(_ANY, "write", note="own; for others platform admins"),
    ("DELETE", "/api/v1/tokens/{token_id}"): Access(
        _ADMIN, "admin", owner=True, note="the token's user needs the write scope only"
    ),
    ("GET", "/api/v1/audit"): Access(_ADMIN, "admin"),
    ("GET", "/api/v1/audit/export"): Access(_ADMIN, "admin"),
    ("GET", "/metrics"): Access(_ADMIN, "read", note="give Prometheus a read-only token"),
    # pipelines
    ("POST", "/api/v1/pipelines"): Access(_MEMBER, "write", note="in the spec's team"),
    ("GET", "/api/v1/pipelines"): Access(_ANY, note=_MINE_OR_TEAM),
    ("GET", "/api/v1/pipelines/{pipeline_id}"): Access(_VIEWER, "read"),
    ("POST", "/api/v1/pipelines/{pipeline_id}/cancel"): Access(_MEMBER, "write"),
    # nodes
    ("GET", "/api/v1/nodes"): Access(_ANY, "read"),
    ("GET", "/api/v1/nodes/{name}/history"): Access(_ANY, "read"),
    ("GET", "/api/v1/nodes/telemetry"): Access(_ANY, "read"),
    ("POST", "/api/v1/nodes/{name}/heartbeat"): Access(_ADMIN, "admin", note="the agents"),
    ("POST", "/api/v1/nodes/{name}/cordon"): Access(_ADMIN, "admin"),
    ("POST", "/api/v1/nodes/{name}/uncordon"): Access(_ADMIN, "admin"),
    ("POST", "/api/v1/nodes/{name}/preflight"): Access(_ADMIN, "admin"),
    ("POST", "/api/v1/health/alerts"): Access(_ADMIN, "admin"),
    # team secrets
    ("GET", "/api/v1/teams/{team}/secrets"): Access(_MEMBER, "read", note="names only"),
    ("PUT", "/api/v1/teams/{team}/secrets/{name}"): Access(_TEAM_ADMIN, "write"),
    ("DELETE", "/api/v1/teams/{team}/secrets/{name}"): Access(_TEAM_ADMIN, "write"),
    # model registry
    ("GET", "/api/v1/artifacts"): Access(_ANY, note="where to push artifacts"),
    ("POST", "/api/v1/artifacts/gc"): Access(_ADMIN, "admin"),
    ("GET", "/api/v1/models"): Access(_ANY, note=_MINE_OR_TEAM),
    ("GET", "/api/v1/models/{team}/{name}"): Access(_VIEWER, "read"),
    ("POST", "/api/v1/models/{team}/{name}/versions"): Access(_MEMBER, "write"),
    ("GET", "/api/v1/models/{team}/{name}/versions/{ref}"): Access(_VIEWER, "read"),
    ("GET", "/api/v1/models/{team}/{name}/versions/{ref}/lineage"): Access(_VIEWER, "read"),
    ("PUT", "/api/v1/models/{team}/{name}/aliases/{alias}"): Access(_MEMBER, "write"),
    ("DELETE", "/api/v1/models/{team}/{name}/aliases/{alias}"): Access(_MEMBER, "write"),
    ("PUT", "/api/v1/models/{team}/{name}/versions/{version}/tags"): Access(_MEMBER, "write"),
    ("GET", "/api/v1/model-versions"): Access(_ANY, note=_MINE),
    # webhook outbox
    ("GET", "/api/v1/webhook-deliveries"): Access(_ADMIN, "read"),
    ("GET", "/api/v1/webhook-deliveries/{row_id}"): Access(_ADMIN, "read"),
    ("POST", "/api/v1/webhook-deliveries/{row_id}/redeliver"): Access(_ADMIN, "write"),
    # serving: deployments, usage and the OpenAI-compatible gateway
    ("POST", "/api/v1/deployments"): Access(_MEMBER, "write", note="in the body's team"),
    ("GET", "/api/v1/deployments"): Access(_ANY, note=_MINE),
    ("GET", "/api/v1/deployments/{name}"): Access(_VIEWER, "read"),
    ("GET", "/api/v1/deployments/{name}/gateway"): Access(_VIEWER, "read"),
    ("POST", "/api/v1/deployments/{name}/scale"): Access(_MEMBER, "write"),
    ("DELETE", "/api/v1/deployments/{name}"): Access(_MEMBER, "write"),
    ("GET", "/api/v1/usage"): Access(_ANY, note=_MINE_OR_TEAM),
    ("GET", "/v1/models"): Access(_ANY, note=_MINE),
    ("POST", "/v1/completions"): Access(_VIEWER, "read", note="in the deployment's team"),
    ("POST", "/v1/chat/completions"): Access(_VIEWER, "read", note="in the deployment's team"),
    # the web console's own routes
    ("POST", "/api/v1/console/session"): Access(_ANY, note="a session token, same scopes"),
    ("GET", "/api/v1/console/session"): Access(_ANY),
    ("DELETE", "/api/v1/console/session"): Access(_ANY, note="revokes the session's token"),
    ("GET", "/api/v1/queue"): Access(_ANY, note=_MINE_OR_TEAM),
    ("GET", "/api/v1/cluster"): Access(_ANY, "read", note="other teams' jobs and users hidden"),
    ("GET", "/api/v1/usage/gpu-hours"): Access(_ANY, note=_MINE_OR_TEAM),
    ("GET", "/api/v1/stream"): Access(_ANY, note="changes of the caller's teams' jobs"),
}
"""Who may call each route of the control plane's app, by (method, path template). HEAD is
left out where a route answers GET (it is GET without the body)."""


def route_keys(routes: Iterable[object]) -> set[tuple[str, str]]:
    """(method, path template) of each route in ``routes`` (an app's ``app.routes``), as
    :data:`ROUTE_ACCESS` names them; a route without methods (a mount) is ``("*", path)``."""
    keys: set[tuple[str, str]] = set()
    for route in routes:
        path = str(getattr(route, "path", ""))
        methods: set[str] = set(getattr(route, "methods", None) or ())
        if not methods:
            keys.add(("*", path))
        keys.update((m, path) for m in methods if m != "HEAD" or "GET" not in methods)
    return keys
