"""S3 settings under which a commit would not be a put-if-absent are refused at start, naming the key; Azure and
GCS credentials are masked, and their Parquet files go through delta-rs's object_store with the same options."""

import json
from pathlib import Path

import pyarrow.fs as pa_fs
import pytest
from deltalake.fs import DeltaStorageHandler

from kafka2delta.config import MASK, load_config
from kafka2delta.config.masking import is_secret_key
from kafka2delta.errors import ConfigError
from kafka2delta.writer import table_filesystem

S3 = """
[kafka]
bootstrap_servers = "127.0.0.1:9092"
topic = "events"
[table]
uri = "s3://lake/events"
[table.storage_options]
AWS_ENDPOINT_URL = "http://127.0.0.1:9000"
AWS_REGION = "us-east-1"
AWS_ALLOW_HTTP = "true"
"""


def config_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "config.toml"
    path.write_text(S3 + extra)
    return path


def test_plain_s3_options_and_conditional_put_etag_are_accepted(tmp_path: Path) -> None:
    config = load_config(
        config_file(tmp_path, 'aws_conditional_put = "etag"\nAWS_S3_ALLOW_UNSAFE_RENAME = "false"\n'), {}
    )
    assert config.table.storage_options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ('aws_conditional_put = "disabled"', "table.storage_options.aws_conditional_put"),
        ('conditional_put = "Disabled"', "table.storage_options.conditional_put"),
        ('AWS_S3_ALLOW_UNSAFE_RENAME = "true"', "table.storage_options.AWS_S3_ALLOW_UNSAFE_RENAME"),
        ('AWS_S3_ALLOW_UNSAFE_RENAME = "y"', "table.storage_options.AWS_S3_ALLOW_UNSAFE_RENAME"),
        ('AWS_S3_LOCKING_PROVIDER = "dynamodb"', "table.storage_options.AWS_S3_LOCKING_PROVIDER"),
    ],
)
def test_unsafe_commit_options_are_refused_naming_the_key(tmp_path: Path, line: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(config_file(tmp_path, line + "\n"), {})
    assert caught.value.key == key


def test_an_aws_profile_in_storage_options_is_refused(tmp_path: Path) -> None:
    # deltalake would use the profile for the log while the Parquet writer's client cannot be given it.
    with pytest.raises(ConfigError) as caught:
        load_config(config_file(tmp_path, 'aws_profile = "lake"\n'), {})
    assert caught.value.key == "table.storage_options.aws_profile" and "AWS_PROFILE" in caught.value.problem
    assert load_config(config_file(tmp_path), {"AWS_PROFILE": "lake"}).table.uri == "s3://lake/events"


def test_from_the_environment_the_variable_is_named(tmp_path: Path) -> None:
    variable = "K2D_TABLE__STORAGE_OPTIONS__AWS_S3_ALLOW_UNSAFE_RENAME"
    with pytest.raises(ConfigError) as caught:
        load_config(config_file(tmp_path), {variable: "true"})
    assert caught.value.key == variable
    # delta-rs reads AWS_* variables of the process too.
    with pytest.raises(ConfigError) as caught:
        load_config(config_file(tmp_path), {"AWS_CONDITIONAL_PUT": "disabled"})
    assert caught.value.key == "AWS_CONDITIONAL_PUT"


# --- Azure and GCS ------------------------------------------------------------------------------------------


def store_config(tmp_path: Path, uri: str, options: str) -> Path:
    path = tmp_path / "store.toml"
    path.write_text(
        f'[kafka]\nbootstrap_servers = "127.0.0.1:9092"\ntopic = "events"\n[table]\nuri = "{uri}"\n'
        f"[table.storage_options]\n{options}"
    )
    return path


@pytest.mark.parametrize(
    ("uri", "options", "secrets", "plain"),
    [
        (
            "az://lake/events",
            'azure_storage_account_name = "acct"\nazure_storage_account_key = "S3cr3tKey=="\n'
            'azure_storage_sas_key = "sv=2024&sig=abc"\nazure_storage_client_secret = "client-secret-value"\n'
            'azure_storage_token = "bearer-token-value"\n',
            ["S3cr3tKey==", "sv=2024&sig=abc", "client-secret-value", "bearer-token-value"],
            ["acct"],
        ),
        (
            "abfss://lake@acct.dfs.core.windows.net/events",
            'azure_storage_access_key = "AltKey=="\nazure_storage_client_id = "app-id"\n',
            ["AltKey=="],
            ["app-id"],
        ),
        (
            "gs://lake/events",
            'google_service_account_key = "{\\"private_key\\": \\"-----BEGIN PRIVATE KEY-----\\"}"\n'
            'google_bearer_token = "ya29.token"\ngoogle_service_account = "/var/run/key.json"\n',
            ['{"private_key": "-----BEGIN PRIVATE KEY-----"}', "ya29.token"],
            ["/var/run/key.json"],
        ),
    ],
)
def test_azure_and_gcs_credentials_are_masked(
    tmp_path: Path, uri: str, options: str, secrets: list[str], plain: list[str]
) -> None:
    config = load_config(store_config(tmp_path, uri, options), {})
    assert sorted(config.secret_values()) == sorted(secrets)
    printed = "\n".join(config.summary()) + json.dumps(config.masked(), default=str)
    for secret in secrets:
        assert secret not in printed
    assert {k for k, v in config.masked()["table"]["storage_options"].items() if v == MASK} == {
        k for k, v in config.table.storage_options.items() if v in secrets
    }
    for key in config.table.storage_options:
        assert is_secret_key(key) == (config.table.storage_options[key] in secrets), key
    assert set(plain) <= set(config.table.storage_options.values())


@pytest.mark.parametrize(
    ("uri", "root"),
    [
        ("az://lake/raw/events", "raw/events"),
        ("abfss://lake@acct.dfs.core.windows.net/raw/events/", "raw/events"),
        ("gs://lake/raw/events", "raw/events"),
        ("gs://lake", ""),
    ],
)
def test_azure_and_gcs_parquet_files_go_through_delta_rs_object_store(uri: str, root: str) -> None:
    """The Parquet writer's filesystem is delta-rs's own object_store client, built from the same options."""
    azure = uri.startswith(("az://", "abfss://"))
    options = {"azure_storage_account_name": "acct", "azure_storage_account_key": "a2V5"} if azure else {}
    filesystem, path = table_filesystem(uri, options)
    assert isinstance(filesystem, pa_fs.PyFileSystem)
    assert isinstance(filesystem.handler, DeltaStorageHandler)
    assert path == root


def test_an_unsupported_scheme_is_refused_naming_the_supported_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        table_filesystem("hdfs://namenode/events", {})
    assert caught.value.key == "table.uri"
    assert "az://" in str(caught.value) and "gs://" in str(caught.value)


@pytest.mark.parametrize("uri", ["az://lake/events", "abfss://lake@acct.dfs.core.windows.net/events", "gs://lake/e"])
def test_spark_jobs_refuse_azure_and_gcs_tables(uri: str) -> None:
    from kafka2delta.spark.session import spark_path

    with pytest.raises(ConfigError) as caught:
        spark_path(uri)
    assert caught.value.key == "table.uri"
    assert "Spark jobs" in str(caught.value)
    assert spark_path("s3://lake/events") == "s3a://lake/events"
