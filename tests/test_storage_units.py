"""The rules of object-store repositories that need no store: URIs read as Triton reads them, the
credentials Triton would pick (its credential file's longest matching entry, the AWS variables, a
profile of the AWS config files), in tritonmp/storage/."""

from __future__ import annotations

import json

import pytest

from tritonmp.storage.credentials import (
    AzureCredentials,
    CredentialError,
    GCSCredentials,
    S3Credentials,
    aws_profile,
    for_location,
)
from tritonmp.storage.locations import Location, LocationError, is_remote, parse


@pytest.mark.parametrize("uri, bucket, prefix, endpoint, account", [
    ("s3://bucket/path/to/repo", "bucket", "path/to/repo", "", ""),
    ("s3://bucket", "bucket", "", "", ""),
    ("s3://bucket//double//slash/", "bucket", "double/slash", "", ""),
    ("s3://localhost:9000/bucket/repo", "bucket", "repo", "http://localhost:9000", ""),
    ("s3://https://s3.example.com:443/bucket/a/b", "bucket", "a/b", "https://s3.example.com:443", ""),
    ("s3://http://10.0.0.1:9000/bucket", "bucket", "", "http://10.0.0.1:9000", ""),
    ("gs://bucket/models", "bucket", "models", "", ""),
    ("as://account/container/path/x", "container", "path/x", "", "account"),
    ("as://account.blob.core.windows.net/container", "container", "", "", "account"),
])
def test_uris_are_read_as_triton_reads_them(uri, bucket, prefix, endpoint, account):
    location = parse(uri)
    assert (location.bucket, location.prefix, location.endpoint, location.account) == (bucket, prefix, endpoint,
                                                                                      account)
    assert is_remote(uri) and not is_remote("/models") and not is_remote("models/s3://x")


@pytest.mark.parametrize("uri", ["s3://", "gs://", "as://account", "s3://https://bucket/path"])
def test_a_uri_without_a_bucket_is_refused(uri):
    with pytest.raises(LocationError):
        parse(uri)


def test_the_credential_file_gives_the_longest_matching_entry_of_its_store(tmp_path):
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps({
        "s3": {"": {"key_id": "any", "secret_key": "any-secret"},
               "s3://bucket/special": {"key_id": "special", "secret_key": "s", "region": "eu-west-1",
                                       "session_token": "t", "profile": "p"}},
        "gs": {"gs://bucket": "/keys/bucket.json", "gs://bucket/deeper": "/keys/deeper.json"},
        "as": {"as://acct/c": {"account_str": "acct", "account_key": "k", "auth_type": "key"}}}))
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(path), "AWS_ACCESS_KEY_ID": "ignored"}
    assert for_location(parse("s3://bucket/special/models"), env) == S3Credentials("special", "s", "t", "eu-west-1",
                                                                                   "p")
    assert for_location(parse("s3://other/models"), env) == S3Credentials("any", "any-secret")
    assert for_location(parse("gs://bucket/deeper/x"), env) == GCSCredentials("/keys/deeper.json")
    assert for_location(parse("gs://bucket/x"), env) == GCSCredentials("/keys/bucket.json")
    assert for_location(parse("as://acct/c/models"), env) == AzureCredentials("acct", "k", "key")
    with pytest.raises(CredentialError, match="Cannot match credential for path as://other/c"):
        for_location(parse("as://other/c"), env)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(CredentialError, match="cannot read the cloud credential file"):
        for_location(parse("gs://bucket"), {"TRITON_CLOUD_CREDENTIAL_PATH": str(tmp_path / "broken.json")})


def test_the_environment_and_the_aws_config_files(tmp_path):
    env = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": "token",
           "AWS_DEFAULT_REGION": "us-west-2", "GOOGLE_APPLICATION_CREDENTIALS": "/key.json",
           "AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_KEY": "k"}
    assert for_location(parse("s3://b"), env) == S3Credentials("id", "secret", "token", "us-west-2")
    assert for_location(parse("gs://b"), env) == GCSCredentials("/key.json")
    assert for_location(parse("as://a/c"), env) == AzureCredentials("acct", "k")
    (tmp_path / "credentials").write_text("[default]\naws_access_key_id = d\naws_secret_access_key = ds\n"
                                          "[team]\naws_access_key_id = t\naws_secret_access_key = ts\n")
    (tmp_path / "config").write_text("[default]\nregion = eu-central-1\n[profile team]\nregion = ap-south-1\n")
    files = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"), "AWS_CONFIG_FILE": str(tmp_path / "config")}
    assert for_location(parse("s3://b"), {"AWS_PROFILE": "team", **files}) == S3Credentials(profile="team")
    assert aws_profile("team", files) == S3Credentials("t", "ts", "", "ap-south-1", "team")
    assert aws_profile("", files) == S3Credentials("d", "ds", "", "eu-central-1", "default")
    assert aws_profile("absent", files) == S3Credentials(profile="absent")
    assert Location("s3://b/p", "s3", "b", "p").key("model", "1/model.onnx") == "p/model/1/model.onnx"
