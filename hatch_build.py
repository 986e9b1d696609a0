"""Hatchling build hook: compiles the optional C extensions (service/protocol/_crecords.c, the record
decoder, service/schemas/_cavro.c, the Avro -> JSON renderer of avro consume, and service/producer/_cproduce.c,
the producer's record encoder).

The extension is built in place next to its source, so editable installs (``pip install -e .``)
import it straight from the tree; standard wheels get it force-included and a platform tag.
A missing compiler or a failed compile only prints a warning: records.py then falls back to its
pure-Python decoder. Set ``KCG_NO_CEXT=1`` to skip the compile altogether.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("service") / "protocol" / "_crecords.c"
MODULE = "_crecords"
# the Avro -> JSON renderer of the avro consume path (service/schemas/avro_fast.py falls back to Python)
AVRO_SOURCE = Path("service") / "schemas" / "_cavro.c"
AVRO_MODULE = "_cavro"
# the producer's record encoder (service/producer/encoding.py falls back to Python)
PRODUCE_SOURCE = Path("service") / "producer" / "_cproduce.c"
PRODUCE_MODULE = "_cproduce"
EXTENSIONS = ((SOURCE, MODULE), (AVRO_SOURCE, AVRO_MODULE), (PRODUCE_SOURCE, PRODUCE_MODULE))


def _compiler() -> list[str] | None:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    argv = shlex.split(cc)
    if argv and shutil.which(argv[0]):
        return argv
    for fallback in ("cc", "gcc", "clang"):
        if shutil.which(fallback):
            return [fallback]
    return None


def build_extension(root: Path, source: Path = SOURCE, module: str = MODULE) -> tuple[Path | None, str]:
    """Compile the extension in place. Returns (path of the built module or None, message)."""
    src = root / source
    if not src.is_file():
        return None, f"{src} not found"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = src.with_name(module + suffix)
    include = sysconfig.get_paths()["include"]
    # Compile to a temporary name, then rename: a running process may have the old module mapped.
    fd, tmp = tempfile.mkstemp(prefix=f".{module}-", suffix=suffix, dir=src.parent)
    os.close(fd)
    cmd = [*cc, "-O2", "-shared", "-fPIC", "-Wall", "-fvisibility=hidden", f"-I{include}", str(src),
           "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        os.unlink(tmp)
        return None, f"compiler did not run: {e}"
    if proc.returncode != 0:
        os.unlink(tmp)
        # never leave a module from an older source behind: records.py falls back to pure Python
        target.unlink(missing_ok=True)
        return None, f"{shlex.join(cmd)} failed:\n{proc.stderr.strip()}"
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target, proc.stderr.strip()


class CustomBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if os.environ.get("KCG_NO_CEXT", "") not in ("", "0"):
            self.app.display_warning("KCG_NO_CEXT set: not building the C record decoder")
            return
        root = Path(self.root)
        for source, module in EXTENSIONS:
            built, message = build_extension(root, source, module)
            if built is None:
                self.app.display_warning(
                    f"C extension {module} not built, the pure-Python code will be used: {message}")
                continue
            if message:
                self.app.display_info(message)
            self.app.display_info(f"built {built.relative_to(root)}")
            if version == "editable":
                continue  # imported in place from the source tree
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            build_data["force_include"][str(built)] = str(built.relative_to(root))
