"""Clients of the three object stores, through obstore (one Rust core speaks S3, GCS and Azure, with
its own retries of transient failures): built for a location and its credentials, with errors
reworded as what failed where. obstore is the optional extra `tritonmp[cloud]`."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from .credentials import AzureCredentials, Credentials, GCSCredentials, S3Credentials, aws_profile
from .locations import Location

INSTALL = "pip install 'tritonmp[cloud]'"
# each request, and each body that breaks off (taken up where it stopped): retried on 5xx answers,
# refused or dropped connections and timeouts, with exponential backoff
RETRIES: dict[str, Any] = {"max_retries": 4, "retry_timeout": timedelta(seconds=60),
                           "backoff": {"init_backoff": timedelta(milliseconds=100),
                                       "max_backoff": timedelta(seconds=5), "base": 2}}
CLIENT: dict[str, Any] = {"connect_timeout": timedelta(seconds=10), "timeout": timedelta(minutes=30)}
_NAMES = {"s3": "S3", "gs": "GCS", "as": "Azure Storage"}
_STATUS = re.compile(r"status code: (\d{3})([^:<\n]*)")
_CODE = re.compile(r"<Code>([^<]+)</Code>")  # S3's and Azure's XML error bodies


class StoreError(Exception):
    """A store that cannot be reached or refuses: the store, what was asked and its answer."""


def obstore_module() -> Any:
    """obstore, or a StoreError naming the extra that installs it."""
    try:
        import obstore
    except ImportError:
        raise StoreError(f"object-store model repositories need obstore: {INSTALL}") from None
    return obstore


def store_errors() -> tuple[type[Exception], ...]:
    """What obstore raises for a store's refusal or failure: its own errors, and Python's
    FileNotFoundError and PermissionError for a missing object or a refused one."""
    return (obstore_module().exceptions.BaseError, FileNotFoundError, PermissionError)


def reworded(e: Exception, location: Location, what: str) -> StoreError:
    """An obstore error as one line: the store, the bucket, what was asked, and the store's answer (its
    HTTP status and error code where it gave them)."""
    text = str(e).split("\n\nDebug source:")[0].strip()
    status = _STATUS.search(text)
    if status is not None:
        code = _CODE.search(text)
        answer = f"HTTP {status.group(1)} {status.group(2).strip()}" + (f" ({code.group(1)})" if code else "")
    else:
        answer = text.splitlines()[0] if text else type(e).__name__
    return StoreError(f"{_NAMES[location.scheme]} bucket '{location.bucket}': {what}: {answer}")


def open_store(location: Location, credentials: Credentials, environ: Mapping[str, str] = os.environ) -> Any:
    """An obstore store for the bucket (or container) of `location`."""
    store = obstore_module().store
    if isinstance(credentials, S3Credentials):
        return _s3(store, location, credentials, environ)
    if isinstance(credentials, GCSCredentials):
        return _gcs(store, location, credentials, environ)
    return _azure(store, location, credentials, environ)


def _client(endpoint: str) -> dict[str, Any]:
    return {**CLIENT, "allow_http": True} if endpoint.startswith("http://") else dict(CLIENT)


def _s3(store: Any, location: Location, cred: S3Credentials, environ: Mapping[str, str]) -> Any:
    """Keys from the credentials, else from a profile of the AWS config files; else obstore's own chain
    (web identity, container and instance credentials). The server a URI names, else AWS_ENDPOINT_URL_S3
    or AWS_ENDPOINT_URL, else AWS."""
    if not (cred.key_id and cred.secret_key):
        profile = aws_profile(cred.profile, environ)
        cred = S3Credentials(profile.key_id, profile.secret_key, profile.session_token, cred.region or profile.region,
                             cred.profile)
    endpoint = location.endpoint or environ.get("AWS_ENDPOINT_URL_S3", "") or environ.get("AWS_ENDPOINT_URL", "")
    config: dict[str, Any] = {"region": cred.region or "us-east-1"}
    if endpoint:
        config |= {"endpoint": endpoint, "virtual_hosted_style_request": False}
    if cred.key_id and cred.secret_key:
        config |= {"access_key_id": cred.key_id, "secret_access_key": cred.secret_key}
        if cred.session_token:
            config["session_token"] = cred.session_token
    return store.S3Store(location.bucket, config=config, client_options=_client(endpoint), retry_config=RETRIES)


def _gcs(store: Any, location: Location, cred: GCSCredentials, environ: Mapping[str, str]) -> Any:
    """A service account's or authorized user's file; on Google Compute Engine, its metadata server;
    else anonymous. An emulator's address in CLOUD_STORAGE_EMULATOR_ENDPOINT or STORAGE_EMULATOR_HOST."""
    endpoint = environ.get("CLOUD_STORAGE_EMULATOR_ENDPOINT", "") or environ.get("STORAGE_EMULATOR_HOST", "")
    if endpoint and "://" not in endpoint:
        endpoint = "http://" + endpoint
    config: dict[str, Any] = {}
    if endpoint:
        config["base_url"] = endpoint.rstrip("/")
    if cred.path:
        config["application_credentials"] = cred.path
    elif not _on_google_compute_engine():
        config["skip_signature"] = True
    return store.GCSStore(location.bucket, config=config, client_options=_client(endpoint), retry_config=RETRIES)


def _on_google_compute_engine() -> bool:
    try:
        with open("/sys/class/dmi/id/product_name", encoding="utf-8") as f:
            return f.read().strip().startswith("Google")
    except OSError:
        return False


def _azure(store: Any, location: Location, cred: AzureCredentials, environ: Mapping[str, str]) -> Any:
    """The account the credentials name, else the URI's; its key, a managed identity, Azure's default
    chain, or anonymous. AZURE_STORAGE_ENDPOINT names another blob endpoint (an emulator, a sovereign
    cloud)."""
    account = cred.account or location.account
    auth = cred.auth_type or ("key" if cred.key else "")
    config: dict[str, Any] = {"account_name": account}
    if auth == "key":
        config["account_key"] = cred.key
    elif auth == "managed_identity":
        if cred.client_id:
            config["client_id"] = cred.client_id
    elif auth != "default":
        config["skip_signature"] = True
    endpoint = environ.get("AZURE_STORAGE_ENDPOINT", "")
    if endpoint:
        config["endpoint"] = endpoint.rstrip("/")
    return store.AzureStore(location.bucket, config=config, client_options=_client(endpoint), retry_config=RETRIES)
