"""The saved-session container (docs/session_format.md): magic, version, CRC-32'd sections.

``write`` and ``read`` handle the bytes only: a META dict (JSON) and the KVCS bytes of
``KvCache.snapshot()``. What META must say to load into a given model is Session.load's business.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from typing import Tuple

from .errors import SessionFileError

MAGIC = b"MNH2OSES"
# 2: META's config names the eviction section "eviction" (1: "h2o"; read as it, config.RENAMED_SECTIONS).
VERSION = 2
OLDEST = 1
SECTIONS = (b"META", b"KVCS")
_HEADER = struct.Struct("<8sII")   # magic, version, section_count; then the header's CRC-32
_SECTION = struct.Struct("<4sQI")  # tag, length, CRC-32 of the payload


def _crc(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def encode(meta: dict, cache: bytes) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, len(SECTIONS))
    parts = [head, struct.pack("<I", _crc(head))]
    for tag, payload in zip(SECTIONS, (json.dumps(meta, ensure_ascii=False).encode("utf-8"), cache)):
        parts += [_SECTION.pack(tag, len(payload), _crc(payload)), payload]
    return b"".join(parts)


def decode(data: bytes, name: str = "the file") -> Tuple[dict, bytes]:
    """(META, KVCS bytes) of a saved session; SessionFileError naming ``name`` and the problem."""
    def fail(why: str):
        raise SessionFileError(f"{name} {why}")

    if len(data) < len(MAGIC) or data[:len(MAGIC)] != MAGIC:
        fail("is not a saved mnn_h2o session (its first bytes are not the session magic)")
    if len(data) < _HEADER.size + 4:
        fail(f"is truncated: {len(data)} bytes, shorter than the session header")
    _, version, count = _HEADER.unpack_from(data, 0)
    (crc,) = struct.unpack_from("<I", data, _HEADER.size)
    if crc != _crc(data[:_HEADER.size]):
        fail("is damaged: its header checksum does not match")
    if version > VERSION:
        fail(f"was written by a newer mnn_h2o (session format version {version}; this one reads "
             f"up to {VERSION}): upgrade mnn_h2o to load it")
    if version < OLDEST or count != len(SECTIONS):
        fail(f"has session format version {version} with {count} sections; versions {OLDEST}-{VERSION} have "
             f"{len(SECTIONS)}")
    pos, payloads = _HEADER.size + 4, []
    for want in SECTIONS:
        if len(data) - pos < _SECTION.size:
            fail(f"is truncated: the {want.decode()} section header is missing (file of {len(data)} bytes)")
        tag, length, crc = _SECTION.unpack_from(data, pos)
        pos += _SECTION.size
        if tag != want:
            fail(f"is damaged: expected the {want.decode()} section, found tag {tag!r}")
        if length > len(data) - pos:
            fail(f"is truncated: the {want.decode()} section needs {length} bytes, {len(data) - pos} are left")
        payload = data[pos:pos + length]
        pos += length
        if _crc(payload) != crc:
            fail(f"is damaged: the {want.decode()} section's checksum does not match")
        payloads.append(payload)
    if pos != len(data):
        fail(f"is damaged: {len(data) - pos} bytes follow the last section")
    try:
        meta = json.loads(payloads[0].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(f"is damaged: its META section is not JSON ({e})")
    if not isinstance(meta, dict):
        fail("is damaged: its META section is not a JSON object")
    return meta, payloads[1]


def write(path: str, meta: dict, cache: bytes) -> None:
    """Writes atomically: a crash leaves the old file or the new one, never half of one."""
    write_atomic(path, encode(meta, cache))


def write_atomic(path: str, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file renamed into place (fsynced first): a crash
    leaves the old file or the new one, never half of one."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read(path: str) -> Tuple[dict, bytes]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SessionFileError(f"cannot read session file {path}: {e.strerror}") from None
    return decode(data, f"session file {path}")
