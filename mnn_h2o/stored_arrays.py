"""Arrays of the export's files (uncompressed .npz members, .npy files) as byte ranges, read
straight into memory the core owns: the decode layers' blocks (native_layers.py) and the q8 rows
of a Q8_0 head (engine.py). Read as numpy arrays first, the largest (the 1.5B's 191 MB output
matrix, Gemma 3's 168 MB of q8 rows) were held twice for a moment: the load's peak.
"""
from __future__ import annotations

import os

import numpy as np


class StoredBlocks:
    """A C-ordered array stored as raw bytes in a file, as that byte range: ``rows`` rows of
    ``row_bytes`` bytes from ``offset``; ``read_into(buffer)`` reads them into memory the core
    owns."""

    def __init__(self, path: str, offset: int, rows: int, row_bytes: int):
        self.path, self.offset, self.rows, self.row_bytes = path, offset, rows, row_bytes

    def read_into(self, buffer) -> None:
        view = memoryview(buffer).cast("B")
        if len(view) != self.rows * self.row_bytes:
            raise ValueError(f"{self.path}: {len(view)} bytes asked of a {self.rows} x {self.row_bytes} array")
        with open(self.path, "rb", buffering=0) as f:
            f.seek(self.offset)
            done = 0
            while done < len(view):  # readinto may return less than asked
                n = f.readinto(view[done:done + (8 << 20)])
                if not n:
                    raise ValueError(f"{self.path}: ends inside an array at byte {self.offset + done}")
                done += n


def _npy_header(f):
    """(shape, dtype, the data's offset) of the .npy header at f's position; None for a version
    or an order this module does not read."""
    version = np.lib.format.read_magic(f)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read_header is None:
        return None
    shape, fortran, dtype = read_header(f)
    if fortran or len(shape) != 2:
        return None
    return shape, dtype, f.tell()


def stored_npy(path: str, dtype) -> StoredBlocks:
    """A 2-D .npy file of ``dtype`` (the export's q8 rows) as a StoredBlocks over its data."""
    with open(path, "rb") as f:
        header = _npy_header(f)
        size = os.fstat(f.fileno()).st_size
    if header is None or header[1] != np.dtype(dtype):
        raise ValueError(f"{path}: not a 2-D C-ordered {np.dtype(dtype)} .npy")
    (rows, cols), dt, data = header
    row_bytes = cols * dt.itemsize
    if data + rows * row_bytes != size:
        raise ValueError(f"{path}: {rows} x {cols} {dt} does not fill its {size} bytes")
    return StoredBlocks(path, data, int(rows), int(row_bytes))


def stored_members(path: str) -> dict:
    """The 2-D uint8 arrays of an .npz that its zip stores uncompressed (what export.NpzWriter
    writes), by name: StoredBlocks over their bytes. Each member's local header and .npy header
    are read and checked against the zip's directory (the data must fill the member exactly)."""
    import struct
    import zipfile

    out = {}
    with open(path, "rb") as f, zipfile.ZipFile(f) as z:
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                continue
            f.seek(info.header_offset)
            head = f.read(30)
            if len(head) != 30 or head[:4] != b"PK\x03\x04":
                raise ValueError(f"{path}: {info.filename}: no local file header at {info.header_offset}")
            name_len, extra_len = struct.unpack("<HH", head[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            f.seek(start)
            header = _npy_header(f)
            if header is None or header[1] != np.uint8:
                continue
            shape, _, data = header
            if data - start + shape[0] * shape[1] != info.file_size:
                raise ValueError(f"{path}: {info.filename}: {shape} does not fill its {info.file_size} bytes")
            out[info.filename[:-4]] = StoredBlocks(path, data, int(shape[0]), int(shape[1]))
    return out
