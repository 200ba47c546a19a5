"""The standard-library S3 client: its SigV4 signatures against botocore's signer, its
addressing, and when `S3Store` uses it rather than boto3."""

from __future__ import annotations

import datetime as dt
import pickle

import pytest

from tensoryard.data.s3http import S3Http, static_credentials
from tensoryard.data.stores import S3Store
from tensoryard.errors import DataError

NOW = dt.datetime(2026, 12, 7, 1, 2, 3, tzinfo=dt.UTC)


def _botocore_authorization(
    client: S3Http, path: str, headers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.config import Config
    from botocore.credentials import Credentials

    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: NOW.replace(tzinfo=None))
    url = f"{client.scheme}://{client.host_header}{path}"
    request = AWSRequest(method="GET", url=url, headers=dict(headers))
    request.context["client_config"] = Config(s3={"payload_signing_enabled": False})
    creds = Credentials(client.access_key, client.secret_key, client.token)
    botocore.auth.S3SigV4Auth(creds, "s3", client.region).add_auth(request)
    return {k.lower(): v for k, v in request.headers.items()}


@pytest.mark.parametrize(
    ("key", "headers", "token", "endpoint"),
    [
        ("corpus/v1/shard-000001.tok", {}, None, None),
        ("corpus/v1/manifest.json", {"Range": "bytes=0-1048575"}, None, "http://127.0.0.1:9000"),
        ("a dir/ünï cøde+(1)=x&y.tok", {"Range": "bytes=5-9"}, "session-token", None),
        ("k", {}, "tok", "https://minio.example.org/base/path"),
    ],
    ids=["virtual-hosted", "path-style with a port and a range", "encoded key", "endpoint path"],
)
def test_a_signature_matches_botocores(
    key: str,
    headers: dict[str, str],
    token: str | None,
    endpoint: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = S3Http(
        "tyard-data", "eu-west-1", "AKIDEXAMPLE", "secret/key+x", token, endpoint_url=endpoint
    )
    path = client.path(key)
    ours = client.signed_headers("GET", path, headers, NOW)
    theirs = _botocore_authorization(client, path, headers, monkeypatch)
    assert ours["authorization"] == theirs["authorization"]
    assert ours["x-amz-date"] == theirs["x-amz-date"] == "20261207T010203Z"
    if token:
        assert ours["x-amz-security-token"] == theirs["x-amz-security-token"] == token


def test_addressing_is_virtual_hosted_on_aws_and_path_style_on_an_endpoint() -> None:
    aws = S3Http("tyard-data", "us-west-2", "k", "s")
    assert (aws.scheme, aws.host_header, aws.path("x/y")) == (
        "https",
        "tyard-data.s3.us-west-2.amazonaws.com",
        "/x/y",
    )
    dotted = S3Http("my.bucket", "us-west-2", "k", "s")  # not valid as a TLS host label
    assert (dotted.host_header, dotted.path("x")) == ("s3.us-west-2.amazonaws.com", "/my.bucket/x")
    local = S3Http("b", "us-east-1", "k", "s", endpoint_url="http://127.0.0.1:9000/")
    assert (local.scheme, local.host_header, local.path("x")) == ("http", "127.0.0.1:9000", "/b/x")
    with pytest.raises(ValueError, match="not an http"):
        S3Http("b", "us-east-1", "k", "s", endpoint_url="ftp://host")


def test_the_client_pickles_without_its_connections() -> None:
    client = S3Http("b", "us-east-1", "k", "s", endpoint_url="http://127.0.0.1:9")
    client._local.conn = object()
    clone = pickle.loads(pickle.dumps(client))
    assert clone.host_header == client.host_header and not hasattr(clone._local, "conn")


def test_static_credentials_only_from_the_two_variables_without_a_profile() -> None:
    env = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    assert static_credentials(env) == ("a", "b", None)
    assert static_credentials(env | {"AWS_SESSION_TOKEN": "t"}) == ("a", "b", "t")
    assert static_credentials(env | {"AWS_PROFILE": "p"}) is None
    assert static_credentials({"AWS_ACCESS_KEY_ID": "a"}) is None


def test_s3store_uses_the_standard_library_client_only_where_it_can(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    monkeypatch.delenv("TYARD_DATA_S3_CLIENT", raising=False)
    http = S3Store("s3://b/p", endpoint_url="http://127.0.0.1:9")._http_client()
    assert isinstance(http, S3Http) and http.region == "ap-south-1"
    assert S3Store("s3://b/p", profile_name="dev")._http_client() is None
    monkeypatch.setenv("TYARD_DATA_S3_CLIENT", "boto3")
    assert S3Store("s3://b/p")._http_client() is None
    monkeypatch.setenv("TYARD_DATA_S3_CLIENT", "curl")
    with pytest.raises(DataError, match=r"TYARD_DATA_S3_CLIENT='curl'.*fix: auto or boto3"):
        S3Store("s3://b/p")._http_client()
    monkeypatch.setenv("TYARD_DATA_S3_CLIENT", "auto")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert S3Store("s3://b/p")._http_client() is None  # boto3's chain finds the credentials
