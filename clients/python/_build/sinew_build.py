"""The build backend of the sinew package (PEP 517 and PEP 660), standard library only.

pyproject.toml names it with ``backend-path``, so ``pip install ./clients/python``
needs no index and no setuptools or wheel: the package is pure Python and a
wheel is a zip file with three metadata files. It builds

- a wheel: the ``sinew`` package (``*.py`` and ``py.typed``) and a
  ``sinew-<version>.dist-info`` directory with ``METADATA``, ``WHEEL`` and a
  ``RECORD`` listing every file with its sha256 and size;
- an sdist: ``pyproject.toml``, ``README.md``, this backend, the package,
  the tests and examples, and ``PKG-INFO``;
- an editable wheel: a ``.pth`` file that puts the source directory on
  ``sys.path``.

Name, version, summary, ``requires-python`` and the readme come from the
``[project]`` table of pyproject.toml. Archive timestamps come from
``SOURCE_DATE_EPOCH`` when set (else 1980-01-01), so two builds of the same
tree give the same bytes.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import re
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "sinew"
TAG = "py3-none-any"
GENERATOR = "sinew_build"
ZIP_EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can carry
SDIST_DIRS = ("_build", "sinew", "tests", "examples")  # sources an sdist carries
SDIST_FILES = ("pyproject.toml", "README.md", "bench.py")


def _project() -> dict[str, object]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["project"])


def _dist_name(name: str) -> str:
    """The name as it appears in file names (PEP 427, PEP 625)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _epoch() -> int:
    try:
        return max(int(os.environ["SOURCE_DATE_EPOCH"]), ZIP_EPOCH)
    except (KeyError, ValueError):
        return ZIP_EPOCH


def _metadata() -> str:
    """Core metadata (version 2.1) of the [project] table, readme as the description."""
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
    ]
    if p.get("description"):
        lines.append(f"Summary: {p['description']}")
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    deps = p.get("dependencies") or []
    for dep in deps if isinstance(deps, list) else []:
        lines.append(f"Requires-Dist: {dep}")
    body = ""
    readme = p.get("readme")
    if isinstance(readme, str):
        lines.append("Description-Content-Type: text/markdown; charset=UTF-8")
        body = (ROOT / readme).read_text(encoding="utf-8")
    return "\n".join(lines) + "\n\n" + body


def _package_files() -> list[tuple[str, Path]]:
    """(archive name, source path) of every file of the package, sorted."""
    out = []
    for path in sorted((ROOT / PACKAGE).rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        if path.suffix == ".py" or path.name == "py.typed":
            out.append((path.relative_to(ROOT).as_posix(), path))
    return out


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(directory: str, files: list[tuple[str, bytes]]) -> str:
    """Writes a wheel holding files plus its dist-info; returns its file name."""
    p = _project()
    name, version = _dist_name(str(p["name"])), str(p["version"])
    info = f"{name}-{version}.dist-info"
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: true\nTag: {TAG}\n"
    entries = list(files) + [
        (f"{info}/METADATA", _metadata().encode("utf-8")),
        (f"{info}/WHEEL", wheel_meta.encode("utf-8")),
    ]
    record = "".join(_record_line(n, d) + "\n" for n, d in entries) + f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode("utf-8")))
    filename = f"{name}-{version}-{TAG}.whl"
    stamp = _epoch()
    when = time.gmtime(stamp)[:6]
    with zipfile.ZipFile(os.path.join(directory, filename), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in entries:
            zi = zipfile.ZipInfo(n, date_time=when)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    return filename


# --- PEP 517 hooks -------------------------------------------------------------

def get_requires_for_build_wheel(config_settings: dict[str, object] | None = None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings: dict[str, object] | None = None) -> list[str]:
    return []


def get_requires_for_build_editable(config_settings: dict[str, object] | None = None) -> list[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: dict[str, object] | None = None) -> str:
    """Writes the dist-info directory (METADATA and WHEEL) a wheel would carry."""
    p = _project()
    info = f"{_dist_name(str(p['name']))}-{p['version']}.dist-info"
    d = Path(metadata_directory) / info
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(_metadata(), encoding="utf-8")
    (d / "WHEEL").write_text(f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: true\nTag: {TAG}\n",
                             encoding="utf-8")
    return info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: dict[str, object] | None = None,
                metadata_directory: str | None = None) -> str:
    """Builds the wheel into wheel_directory and returns its file name."""
    return _write_wheel(wheel_directory, [(n, p.read_bytes()) for n, p in _package_files()])


def build_editable(wheel_directory: str, config_settings: dict[str, object] | None = None,
                   metadata_directory: str | None = None) -> str:
    """Builds a wheel whose only module is a .pth file naming the source directory."""
    pth = (str(ROOT) + "\n").encode("utf-8")
    return _write_wheel(wheel_directory, [(f"__editable__.{_dist_name(PACKAGE)}.pth", pth)])


def build_sdist(sdist_directory: str, config_settings: dict[str, object] | None = None) -> str:
    """Builds the source archive into sdist_directory and returns its file name."""
    p = _project()
    base = f"{_dist_name(str(p['name']))}-{p['version']}"
    files: list[tuple[str, bytes]] = [("PKG-INFO", _metadata().encode("utf-8"))]
    for f in SDIST_FILES:
        if (ROOT / f).is_file():
            files.append((f, (ROOT / f).read_bytes()))
    for d in SDIST_DIRS:
        for path in sorted((ROOT / d).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.append((path.relative_to(ROOT).as_posix(), path.read_bytes()))
    filename = f"{base}.tar.gz"
    stamp = _epoch()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for n, data in sorted(files):
            ti = tarfile.TarInfo(f"{base}/{n}")
            ti.size = len(data)
            ti.mtime = stamp
            ti.mode = 0o644
            tar.addfile(ti, io.BytesIO(data))
    with open(os.path.join(sdist_directory, filename), "wb") as out:
        with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=stamp) as gz:
            gz.write(raw.getvalue())
    return filename
