"""Configuration values read from files: the ``_file`` suffix (TOML and environment) and ``K2D_SECRETS_DIR``."""

from pathlib import Path

import pytest

from kafka2delta.config import MASK, load_config
from kafka2delta.errors import ConfigError

MINIMAL = """
[kafka]
bootstrap_servers = "127.0.0.1:9092"
topic = "events"
[table]
uri = "/tmp/events"
"""


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def config_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "config.toml"
    path.write_text(MINIMAL + extra)
    return path


def test_file_suffix_in_toml_reads_the_value_and_masks_it(tmp_path: Path) -> None:
    password = write(tmp_path / "password", "s3cr3t-registry\n")
    sasl = write(tmp_path / "sasl", "s3cr3t-sasl")
    username = write(tmp_path / "username", "ingest\n")
    text = (
        "[schema_registry]\nurl = 'http://registry:8081'\nusername = 'u'\n"
        f"password_file = '{password}'\n"
        f"[kafka.settings]\n'sasl.password_file' = '{sasl}'\n'sasl.username_file' = '{username}'\n"
    )
    config = load_config(config_file(tmp_path, text), environ={})
    assert config.schema_registry.password == "s3cr3t-registry"  # one trailing newline dropped
    assert config.kafka.settings["sasl.password"] == "s3cr3t-sasl"
    assert config.kafka.settings["sasl.username"] == "ingest"
    assert "sasl.password_file" not in config.kafka.settings
    # Read from a file: a secret whatever the key's name (the username too).
    masked = config.masked()
    assert masked["kafka"]["settings"]["sasl.username"] == MASK
    assert masked["schema_registry"]["password"] == MASK
    assert {"s3cr3t-registry", "s3cr3t-sasl", "ingest"} <= set(config.secret_values())
    assert "s3cr3t" not in repr(masked)


def test_file_suffix_in_the_environment(tmp_path: Path) -> None:
    sasl = write(tmp_path / "sasl", "from-file\n")
    secret_key = write(tmp_path / "aws", "AKIA-secret")
    token = write(tmp_path / "token", "federated")
    environ = {
        "K2D_KAFKA__SETTINGS__SASL_PASSWORD_FILE": sasl,
        "K2D_TABLE__STORAGE_OPTIONS__AWS_SECRET_ACCESS_KEY_FILE": secret_key,
        # An object-store option that names a file itself is passed through, never read.
        "K2D_TABLE__STORAGE_OPTIONS__AZURE_FEDERATED_TOKEN_FILE": token,
    }
    config = load_config(config_file(tmp_path), environ=environ)
    assert config.kafka.settings["sasl.password"] == "from-file"
    assert config.table.storage_options["AWS_SECRET_ACCESS_KEY"] == "AKIA-secret"
    assert config.table.storage_options["AZURE_FEDERATED_TOKEN_FILE"] == token
    assert "from-file" in config.secret_values()


def test_keys_that_end_in_file_keep_their_meaning(tmp_path: Path) -> None:
    schema = write(tmp_path / "event.avsc", '{"type": "record", "name": "E", "fields": []}')
    config = load_config(config_file(tmp_path, f"[format]\ntype = 'avro'\navro_schema_file = '{schema}'\n"), {})
    assert config.format.avro_schema_file == schema


def test_a_missing_file_names_the_key_and_the_variable(tmp_path: Path) -> None:
    environ = {"K2D_SCHEMA_REGISTRY__PASSWORD_FILE": str(tmp_path / "absent")}
    with pytest.raises(ConfigError) as raised:
        load_config(config_file(tmp_path, "[schema_registry]\nurl = 'http://r:8081'\n"), environ=environ)
    message = str(raised.value)
    assert "schema_registry.password_file (from K2D_SCHEMA_REGISTRY__PASSWORD_FILE)" in message
    assert "cannot read" in message and "absent" in message


def test_value_and_file_together_are_refused(tmp_path: Path) -> None:
    sasl = write(tmp_path / "sasl", "x")
    text = f"[kafka.settings]\n'sasl.password' = 'inline'\n'sasl.password_file' = '{sasl}'\n"
    with pytest.raises(ConfigError) as raised:
        load_config(config_file(tmp_path, text), environ={})
    assert "kafka.settings.sasl.password_file" in str(raised.value)
    assert "not both" in str(raised.value)
    assert "inline" not in str(raised.value)


def test_secrets_dir_holds_variables_as_files(tmp_path: Path) -> None:
    # A Kubernetes Secret mounted as a volume: one symlink per key into ..data/, plus the ..data link itself.
    stamped = tmp_path / "secrets" / "..2026_11_26"
    stamped.mkdir(parents=True)
    (stamped / "K2D_KAFKA__SETTINGS__SASL_PASSWORD").write_text("mounted-secret")
    (stamped / "K2D_TABLE__STORAGE_OPTIONS__AWS_ACCESS_KEY_ID").write_text("AKIAMOUNTED\n")
    (stamped / "K2D_KAFKA__GROUP_ID").write_text("orders-ingest")
    (stamped / "K2D_SCHEMA_REGISTRY__PASSWORD_FILE").write_text(write(tmp_path / "registry", "via-file"))
    (tmp_path / "secrets" / "..data").symlink_to(stamped.name)
    names = [p.name for p in stamped.iterdir()]
    for name in names:
        (tmp_path / "secrets" / name).symlink_to(f"..data/{name}")
    environ = {"K2D_SECRETS_DIR": str(tmp_path / "secrets")}
    config = load_config(config_file(tmp_path, "[schema_registry]\nurl = 'http://r:8081'\nusername = 'u'\n"), environ)
    assert config.kafka.settings["sasl.password"] == "mounted-secret"
    assert config.table.storage_options["AWS_ACCESS_KEY_ID"] == "AKIAMOUNTED"
    assert config.kafka.group_id == "orders-ingest"
    assert config.schema_registry.password == "via-file"  # a _FILE variable in the directory names a file too
    assert config.masked()["table"]["storage_options"]["AWS_ACCESS_KEY_ID"] == MASK
    assert {"mounted-secret", "AKIAMOUNTED", "via-file"} <= set(config.secret_values())
    # As in the environment, a value whose key is no secret's stays readable in the logs.
    assert "orders-ingest" not in config.secret_values()


def test_secrets_dir_refuses_a_file_that_is_no_k2d_variable(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "AWS_SECRET_ACCESS_KEY").write_text("would be ignored")
    with pytest.raises(ConfigError) as raised:
        load_config(config_file(tmp_path), environ={"K2D_SECRETS_DIR": str(tmp_path / "secrets")})
    assert raised.value.key == "K2D_SECRETS_DIR/AWS_SECRET_ACCESS_KEY"
    assert "K2D_TABLE__STORAGE_OPTIONS__AWS_SECRET_ACCESS_KEY" in raised.value.problem
    assert "would be ignored" not in str(raised.value)


def test_secrets_dir_and_environment_naming_one_variable_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "K2D_KAFKA__SETTINGS__SASL_PASSWORD").write_text("a")
    environ = {"K2D_SECRETS_DIR": str(tmp_path / "secrets"), "K2D_KAFKA__SETTINGS__SASL_PASSWORD": "b"}
    with pytest.raises(ConfigError, match="K2D_KAFKA__SETTINGS__SASL_PASSWORD: set both"):
        load_config(config_file(tmp_path), environ=environ)
    with pytest.raises(ConfigError, match=r"K2D_SECRETS_DIR: .* is not a directory"):
        load_config(config_file(tmp_path), environ={"K2D_SECRETS_DIR": str(tmp_path / "nowhere")})


def test_the_environment_overrides_the_toml_files_value_either_way(tmp_path: Path) -> None:
    # config.example.toml's empty password, then a Kubernetes Secret mounted as a file through the environment.
    registry = "[schema_registry]\nurl = 'http://r:8081'\nusername = 'u'\npassword = ''\n"
    password = write(tmp_path / "password", "from-env-file")
    config = load_config(config_file(tmp_path, registry), {"K2D_SCHEMA_REGISTRY__PASSWORD_FILE": password})
    assert config.schema_registry.password == "from-env-file"
    # A TOML file with a real value, the environment's file wins over it.
    inline = "[kafka.settings]\n'sasl.password' = 'in-toml'\n"
    config = load_config(config_file(tmp_path, inline), {"K2D_KAFKA__SETTINGS__SASL_PASSWORD_FILE": password})
    assert config.kafka.settings["sasl.password"] == "from-env-file"
    # A TOML _file key, the environment's value wins over it (and the file is not read, nor called a file's).
    toml_file = f"[dead_letters]\ntable_uri_file = '{tmp_path / 'absent'}'\n"
    config = load_config(config_file(tmp_path, toml_file), {"K2D_DEAD_LETTERS__TABLE_URI": "/lake/letters"})
    assert config.dead_letters.table_uri == "/lake/letters"
    assert config.masked()["dead_letters"]["table_uri"] == "/lake/letters"


def test_a_route_takes_values_from_files(tmp_path: Path) -> None:
    uri = write(tmp_path / "uri", "s3://lake/orders\n")
    text = f"[[routes]]\ntopic = 'events'\nuri_file = '{uri}'\n"
    config = load_config(config_file(tmp_path, text), environ={})
    assert config.routes[0].uri == "s3://lake/orders"
    assert config.masked()["routes"][0]["uri"] == MASK
    assert "s3://lake/orders" in config.secret_values()


def test_a_value_read_from_a_file_is_never_echoed_by_a_conversion_error(tmp_path: Path) -> None:
    port = write(tmp_path / "port", "not-a-port-but-a-secret")
    with pytest.raises(ConfigError) as raised:
        load_config(config_file(tmp_path, f"[metrics]\nport_file = '{port}'\n"), environ={})
    assert "metrics.port" in str(raised.value) and "not-a-port-but-a-secret" not in str(raised.value)
