"""Who may do what: principals, roles, scopes and the one rule table of the API.

Pure (no I/O). A user token resolves to a :class:`Principal`: the user's platform-admin flag,
their role in each team and the token's scopes. :func:`authorize` checks one action against
the rule table and raises :class:`Forbidden` with a message that says what is missing and who
can grant it. Job tokens never become principals: they only authenticate the report endpoint
of their own job and attempt (see ``app.py``).

Roles per team, weakest first: viewer (read) < member (submit, cancel) < team-admin (manage the
team's members). Platform admins may do everything, including what no team role allows:
create teams, set quotas, create users, read the audit log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from tensoryard.errors import Forbidden
from tensoryard.store import TEAM_ROLES, TOKEN_SCOPES, TokenRecord, UserRecord

__all__ = [
    "JOB_EVENT_KINDS",
    "RULES",
    "Action",
    "Principal",
    "Rule",
    "authorize",
    "principal_of",
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
