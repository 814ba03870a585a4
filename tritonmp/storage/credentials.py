"""The credentials for an object-store repository, as Triton finds them: from the JSON file that
TRITON_CLOUD_CREDENTIAL_PATH names (per store, the entry whose name is the longest prefix of the
URI), else from the environment: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN /
AWS_DEFAULT_REGION or a profile of the AWS config files (AWS_PROFILE, else "default");
GOOGLE_APPLICATION_CREDENTIALS; AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY / AZURE_STORAGE_AUTH_TYPE /
AZURE_STORAGE_CLIENT_ID."""

from __future__ import annotations

import configparser
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .locations import Location


class CredentialError(ValueError):
    """A credential file that cannot be read, or that has no entry for a repository."""


@dataclass(frozen=True)
class S3Credentials:
    key_id: str = ""
    secret_key: str = ""
    session_token: str = ""
    region: str = ""
    profile: str = ""


@dataclass(frozen=True)
class GCSCredentials:
    path: str = ""  # a service account's or an authorized user's JSON file


@dataclass(frozen=True)
class AzureCredentials:
    account: str = ""
    key: str = ""
    auth_type: str = ""  # "key", "managed_identity", "default", or "" (key when one is given, else anonymous)
    client_id: str = ""  # a user-assigned managed identity


Credentials = S3Credentials | GCSCredentials | AzureCredentials


def for_location(location: Location, environ: Mapping[str, str] = os.environ) -> Credentials:
    """The credentials Triton would use for `location`."""
    file = environ.get("TRITON_CLOUD_CREDENTIAL_PATH")
    if file:
        return _from_file(file, location)
    if location.scheme == "s3":
        return _aws_from_environment(environ)
    if location.scheme == "gs":
        return GCSCredentials(environ.get("GOOGLE_APPLICATION_CREDENTIALS", ""))
    return AzureCredentials(environ.get("AZURE_STORAGE_ACCOUNT", ""), environ.get("AZURE_STORAGE_KEY", ""),
                            environ.get("AZURE_STORAGE_AUTH_TYPE", ""), environ.get("AZURE_STORAGE_CLIENT_ID", ""))


def _from_file(file: str, location: Location) -> Credentials:
    try:
        with open(file, encoding="utf-8") as f:
            document = json.load(f)
    except (OSError, ValueError) as e:
        raise CredentialError(f"cannot read the cloud credential file '{file}' (TRITON_CLOUD_CREDENTIAL_PATH): "
                              f"{e}") from None
    entries = document.get(location.scheme) if isinstance(document, dict) else None
    if not isinstance(entries, dict):
        entries = {}
    for name in sorted(entries, key=len, reverse=True):
        if location.uri.startswith(name):
            value = entries[name]
            if location.scheme == "gs":
                return GCSCredentials(str(value))
            value = value if isinstance(value, dict) else {}
            if location.scheme == "s3":
                return S3Credentials(value.get("key_id", ""), value.get("secret_key", ""),
                                     value.get("session_token", ""), value.get("region", ""), value.get("profile", ""))
            return AzureCredentials(value.get("account_str", ""), value.get("account_key", ""),
                                    value.get("auth_type", ""), value.get("client_id", ""))
    raise CredentialError(f"Cannot match credential for path {location.uri} in the cloud credential file '{file}'")


def _aws_from_environment(environ: Mapping[str, str]) -> S3Credentials:
    key_id, secret = environ.get("AWS_ACCESS_KEY_ID", ""), environ.get("AWS_SECRET_ACCESS_KEY", "")
    region = environ.get("AWS_DEFAULT_REGION", "") or environ.get("AWS_REGION", "")
    if key_id and secret:
        return S3Credentials(key_id, secret, environ.get("AWS_SESSION_TOKEN", ""), region)
    return S3Credentials(region=region, profile=environ.get("AWS_PROFILE", ""))


def aws_profile(profile: str, environ: Mapping[str, str] = os.environ) -> S3Credentials:
    """A profile of the AWS shared credentials and config files (AWS_SHARED_CREDENTIALS_FILE and
    AWS_CONFIG_FILE, else ~/.aws/credentials and ~/.aws/config): its keys and region, each empty where
    the files do not give it."""
    name = profile or "default"
    home = os.path.expanduser("~")
    shared = _ini(environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"))
    config = _ini(environ.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"))
    keys = shared.get(name, {})
    settings = config.get(name if name == "default" else f"profile {name}", config.get(name, {}))

    def value(key: str) -> str:
        return keys.get(key) or settings.get(key) or ""

    return S3Credentials(value("aws_access_key_id"), value("aws_secret_access_key"), value("aws_session_token"),
                         settings.get("region", "") or keys.get("region", ""), name)


def _ini(path: str) -> dict[str, dict[str, str]]:
    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error):
        return {}
    return {section: dict(parser.items(section)) for section in parser.sections()}
