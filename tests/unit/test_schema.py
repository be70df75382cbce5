import pyarrow as pa
import pytest

from kafka2delta.schema import parse_schema, parse_type


def test_parse_schema_types_and_nullability() -> None:
    schema = parse_schema(
        {
            "id": "string not null",
            "n": "long",
            "amount": "decimal(38, 0)",
            "ts": "timestamp",
            "tags": "array<string>",
            "attrs": "map<string,int>",
            "user": "struct<id:long,geo:struct<lat:double,lon:double>>",
        }
    )
    assert schema.field("id").nullable is False
    assert schema.field("n").type == pa.int64()
    assert schema.field("amount").type == pa.decimal128(38, 0)
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert schema.field("tags").type == pa.list_(pa.string())
    assert schema.field("attrs").type == pa.map_(pa.string(), pa.int32())
    assert schema.field("user").type.field("geo").type.field("lon").type == pa.float64()
    assert schema.names == ["id", "n", "amount", "ts", "tags", "attrs", "user"]


@pytest.mark.parametrize("text", ["uuid", "decimal(40,2)", "struct<id>", "map<string>"])
def test_bad_types_are_named(text: str) -> None:
    with pytest.raises(ValueError):
        parse_type(text)
