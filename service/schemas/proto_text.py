""".proto text -> ``FileDescriptorProto`` with protoc (``grpcio-tools``), for registries that only hand out text.

A Schema Registry stores a Protobuf schema as ``.proto`` text. Confluent's registry also serves it as a
serialized descriptor (``?format=serialized``), but Karapace 5 cannot do that for a schema with references (it
parses the text without them and answers 500), and serves text only for subject versions. So the gateway
compiles the text itself, with the real protoc (the one ``grpcio-tools`` ships), from the schema and the texts
of every schema it imports (the registry's references, by import name); well-known imports
(``google/protobuf/*.proto``) come from protoc's own include directory. Compiling runs protoc in a subprocess
(its diagnostics are the error message), once per schema id: the result is cached with the codec.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from google.protobuf import descriptor_pb2

from service.schemas.protobuf import ProtobufSchemaError

WELL_KNOWN_PREFIX = "google/protobuf/"
PROTOC_TIMEOUT_S = 30.0


def _safe_relative(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts or "\\" in name or "\0" in name:
        raise ProtobufSchemaError(f"import name {name!r} is not a relative .proto path")
    return p


def _include_dir() -> str | None:
    try:
        import grpc_tools
    except ImportError:
        return None
    return str(Path(grpc_tools.__file__).parent / "_proto")


def available() -> bool:
    return _include_dir() is not None


_TEXT = re.compile(r"\b(syntax|message|enum|package|import)\b")


def looks_like_text(schema: str) -> bool:
    """``.proto`` text rather than the base64 of a serialized descriptor (base64 has no spaces or ';')."""
    return bool(_TEXT.search(schema)) and (";" in schema or "{" in schema)


def compile_proto(main_name: str, text: str, imports: Mapping[str, str]
                  ) -> tuple[descriptor_pb2.FileDescriptorProto, dict[str, descriptor_pb2.FileDescriptorProto]]:
    """The main file's descriptor and its imports' (import name -> descriptor, well-known ones left out).
    Raises ProtobufSchemaError with protoc's diagnostics."""
    include = _include_dir()
    if include is None:
        raise ProtobufSchemaError("compiling .proto text needs the grpcio-tools package (protoc); it is not installed")
    with tempfile.TemporaryDirectory(prefix="kcg-proto-") as tmp:
        root = Path(tmp) / "src"
        for name, body in {**imports, main_name: text}.items():
            path = root / _safe_relative(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body, "utf-8")
        out = Path(tmp) / "set.pb"
        cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"-I{include}", "--include_imports",
               f"--descriptor_set_out={out}", main_name]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=PROTOC_TIMEOUT_S, cwd=tmp,
                                 env={**os.environ, "PYTHONWARNINGS": "ignore"})
        except subprocess.TimeoutExpired:
            raise ProtobufSchemaError(f"protoc did not finish within {PROTOC_TIMEOUT_S:.0f} s") from None
        if run.returncode != 0 or not out.exists():
            diag = " ".join((run.stderr or run.stdout or f"protoc exit {run.returncode}").replace(str(root) + "/", "")
                            .split())
            raise ProtobufSchemaError(f"the .proto text does not compile: {diag[:2000]}")
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    by_name = {f.name: f for f in fds.file}
    main = by_name.pop(main_name)
    deps = {n: f for n, f in by_name.items() if not n.startswith(WELL_KNOWN_PREFIX)}
    return main, deps
