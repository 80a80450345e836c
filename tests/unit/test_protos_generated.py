"""The wire contract: generated code is current, everything is documented, enums start UNSPECIFIED."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "protos"
GEN_SCRIPT = ROOT / "scripts" / "gen_protos.py"

# Field numbers of the repeated members in descriptor.proto, as used by SourceCodeInfo paths.
FILE_MESSAGE, FILE_ENUM, FILE_SERVICE = 4, 5, 6
MSG_FIELD, MSG_NESTED, MSG_ENUM, MSG_ONEOF = 2, 3, 4, 8
ENUM_VALUE, SERVICE_METHOD = 2, 2


def _load_gen_protos():
    spec = importlib.util.spec_from_file_location("gen_protos", GEN_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[descriptor_pb2.FileDescriptorProto]:
    """Descriptors of protos/epd/v1/*.proto with their comments (protoc --include_source_info)."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("descriptors") / "epd.pb"
    protos = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / "epd" / "v1").glob("*.proto"))
    rc = protoc.main(["protoc", f"-I{PROTO_ROOT}", "--include_source_info", f"--descriptor_set_out={out}", *protos])
    assert rc == 0
    return list(descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file)


def _enum_items(enum, path, prefix) -> Iterator[tuple[str, tuple[int, ...]]]:
    yield f"enum {prefix}{enum.name}", path
    for i, value in enumerate(enum.value):
        yield f"enum value {prefix}{enum.name}.{value.name}", (*path, ENUM_VALUE, i)


def _message_items(msg, path, prefix) -> Iterator[tuple[str, tuple[int, ...]]]:
    name = f"{prefix}{msg.name}"
    yield f"message {name}", path
    for i, field in enumerate(msg.field):
        yield f"field {name}.{field.name}", (*path, MSG_FIELD, i)
    for i, oneof in enumerate(msg.oneof_decl):
        if not oneof.name.startswith("_"):  # synthetic oneofs of proto3 `optional` have no source
            yield f"oneof {name}.{oneof.name}", (*path, MSG_ONEOF, i)
    for i, nested in enumerate(msg.nested_type):
        yield from _message_items(nested, (*path, MSG_NESTED, i), f"{name}.")
    for i, enum in enumerate(msg.enum_type):
        yield from _enum_items(enum, (*path, MSG_ENUM, i), f"{name}.")


def _documentable(file) -> Iterator[tuple[str, tuple[int, ...]]]:
    for i, msg in enumerate(file.message_type):
        yield from _message_items(msg, (FILE_MESSAGE, i), "")
    for i, enum in enumerate(file.enum_type):
        yield from _enum_items(enum, (FILE_ENUM, i), "")
    for i, service in enumerate(file.service):
        yield f"service {service.name}", (FILE_SERVICE, i)
        for j, method in enumerate(service.method):
            yield f"rpc {service.name}.{method.name}", (FILE_SERVICE, i, SERVICE_METHOD, j)


def _all_enums(file) -> Iterator[descriptor_pb2.EnumDescriptorProto]:
    yield from file.enum_type
    stack = list(file.message_type)
    while stack:
        msg = stack.pop()
        yield from msg.enum_type
        stack.extend(msg.nested_type)


def test_generated_code_is_up_to_date():
    proc = subprocess.run([sys.executable, str(GEN_SCRIPT), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_reports_changed_missing_and_extra_files(tmp_path):
    gen = _load_gen_protos()
    fresh, committed = tmp_path / "fresh", tmp_path / "committed"
    fresh.mkdir(), committed.mkdir()
    for name, text in [("a_pb2.py", "x"), ("b_pb2.pyi", "y"), ("__init__.py", "")]:
        (fresh / name).write_text(text)
    (committed / "a_pb2.py").write_text("changed")
    (committed / "__init__.py").write_text("")
    (committed / "gone_pb2_grpc.py").write_text("orphan")
    (committed / "helpers.py").write_text("not ours")
    assert gen.stale_files(fresh, committed) == ["a_pb2.py", "b_pb2.pyi", "gone_pb2_grpc.py"]


def test_package_is_epd_v1_and_one_file_per_service(files):
    assert {f.package for f in files} == {"epd.v1"}
    assert all(f.syntax == "proto3" for f in files)
    assert all(len(f.service) <= 1 for f in files)
    services = {s.name for f in files for s in f.service}
    assert services == {"Encoder", "Prefill", "Decode", "Transfer", "Router"}


def test_every_message_field_enum_and_rpc_has_a_leading_comment(files):
    undocumented = []
    for file in files:
        comments = {tuple(loc.path): loc.leading_comments.strip() for loc in file.source_code_info.location}
        undocumented += [f"{file.name}: {what}" for what, path in _documentable(file) if not comments.get(path)]
    assert not undocumented, "missing // comment on:\n" + "\n".join(undocumented)


def test_enum_zero_values_are_unspecified(files):
    for file in files:
        for enum in _all_enums(file):
            zero = [v.name for v in enum.value if v.number == 0]
            assert zero and zero[0].endswith("_UNSPECIFIED"), f"{file.name}: enum {enum.name} zero is {zero}"


def test_no_float_lists_any_or_opaque_blobs_for_tensors(files):
    float_types = {descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT, descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE}
    for file in files:
        assert not [d for d in file.dependency if d.startswith("google/protobuf/")], file.name
        stack = list(file.message_type)
        while stack:
            msg = stack.pop()
            stack.extend(msg.nested_type)
            for field in msg.field:
                repeated = field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
                assert not (repeated and field.type in float_types), f"{msg.name}.{field.name}"
