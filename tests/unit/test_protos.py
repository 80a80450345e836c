"""The wire contract: generated code is current, every field is documented, enums start UNSPECIFIED."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from epd.v1 import common_pb2, decode_pb2, encoder_pb2, prefill_pb2, router_pb2, transfer_pb2

ROOT = Path(__file__).resolve().parents[2]
PROTOS = sorted((ROOT / "protos" / "epd" / "v1").glob("*.proto"))
MODULES = [common_pb2, decode_pb2, encoder_pb2, prefill_pb2, router_pb2, transfer_pb2]
FIELD = re.compile(r"^\s*(optional\s+|repeated\s+)?[\w.]+\s+\w+\s*=\s*\d+;")
ENUM_VALUE = re.compile(r"^\s*[A-Z][A-Z0-9_]*\s*=\s*\d+;")
DECL = re.compile(r"^\s*(message|enum|service|rpc|oneof)\s")


def test_generated_code_is_up_to_date():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("proto", PROTOS, ids=lambda p: p.name)
def test_every_declaration_and_field_has_a_comment(proto):
    lines = proto.read_text().splitlines()
    undocumented = [
        f"{proto.name}:{i + 1}: {line.strip()}"
        for i, line in enumerate(lines)
        if (FIELD.match(line) or ENUM_VALUE.match(line) or DECL.match(line))
        and not (i > 0 and lines[i - 1].strip().startswith("//"))
    ]
    assert not undocumented, "\n".join(undocumented)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_enum_zero_values_are_unspecified(module):
    enums = list(module.DESCRIPTOR.enum_types_by_name.values())
    for message in module.DESCRIPTOR.message_types_by_name.values():
        enums += list(message.enum_types)
    for enum in enums:
        assert enum.values_by_number[0].name.endswith("_UNSPECIFIED"), enum.full_name


def test_no_float_lists_or_any_on_the_wire():
    for proto in PROTOS:
        text = proto.read_text()
        assert "repeated float" not in text and "repeated double" not in text, proto.name
        assert "google.protobuf.Any" not in text, proto.name


def test_generate_response_is_a_oneof_of_chunk_complete_error():
    oneof = router_pb2.GenerateResponse.DESCRIPTOR.oneofs_by_name["event"]
    assert [f.name for f in oneof.fields] == ["chunk", "complete", "error"]


def test_seed_has_presence():
    params = common_pb2.SamplingParams()
    assert not params.HasField("seed")
    params.seed = 0
    assert params.HasField("seed")
