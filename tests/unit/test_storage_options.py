"""S3 settings under which a commit would not be a put-if-absent are refused at start, naming the key."""

from pathlib import Path

import pytest

from kafka2delta.config import load_config
from kafka2delta.errors import ConfigError

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
        ('AWS_S3_LOCKING_PROVIDER = "dynamodb"', "table.storage_options.AWS_S3_LOCKING_PROVIDER"),
    ],
)
def test_unsafe_commit_options_are_refused_naming_the_key(tmp_path: Path, line: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(config_file(tmp_path, line + "\n"), {})
    assert caught.value.key == key


def test_from_the_environment_the_variable_is_named(tmp_path: Path) -> None:
    variable = "K2D_TABLE__STORAGE_OPTIONS__AWS_S3_ALLOW_UNSAFE_RENAME"
    with pytest.raises(ConfigError) as caught:
        load_config(config_file(tmp_path), {variable: "true"})
    assert caught.value.key == variable
    # delta-rs reads AWS_* variables of the process too.
    with pytest.raises(ConfigError) as caught:
        load_config(config_file(tmp_path), {"AWS_CONDITIONAL_PUT": "disabled"})
    assert caught.value.key == "AWS_CONDITIONAL_PUT"
