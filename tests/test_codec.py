"""The Gear codec from Python: bit-exact round trips, hand-built frames, damage, inspect, the
offline evaluator's core on a tiny synthetic cache, and an independent reference decoder of the
format (docs/gear_format.md) that every encoded frame must satisfy."""
import struct

import numpy as np
import pytest

from mnn_h2o import codec
from mnn_h2o.codec import GearError

M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, lane):
    return (_rotl((acc + lane * P2) & M64, 31) * P1) & M64


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 straight from the xxHash specification, independent of the native one."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed, (seed - P1) & M64]
        while i + 32 <= n:
            for j in range(4):
                v[j] = _round(v[j], struct.unpack_from("<Q", data, i + 8 * j)[0])
            i += 32
        acc = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M64
        for x in v:
            acc = ((acc ^ _round(0, x)) * P1 + P4) & M64
    else:
        acc = (seed + P5) & M64
    acc = (acc + n) & M64
    while i + 8 <= n:
        acc = (_rotl(acc ^ _round(0, struct.unpack_from("<Q", data, i)[0]), 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        acc = (_rotl(acc ^ (struct.unpack_from("<I", data, i)[0] * P1 & M64), 23) * P2 + P3) & M64
        i += 4
    while i < n:
        acc = (_rotl(acc ^ (data[i] * P5 & M64), 11) * P1) & M64
        i += 1
    acc ^= acc >> 33
    acc = acc * P2 & M64
    acc ^= acc >> 29
    acc = acc * P3 & M64
    return acc ^ (acc >> 32)



# --- a reference implementation of docs/gear_format.md, written from the document alone ----------

L_RANS = 1 << 16


class _BitReader:
    """Bits from the least significant bit of each byte up, byte after byte."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def get(self, n: int) -> int:
        v = 0
        for i in range(n):
            if self.pos >> 3 >= len(self.data):
                raise ValueError("table runs past the payload")
            v |= (self.data[self.pos >> 3] >> (self.pos & 7) & 1) << i
            self.pos += 1
        return v

    def eg(self, k: int) -> int:
        n = 0
        while self.get(1):
            n += 1
            if n > 16:
                raise ValueError("EG prefix longer than 16")
        return ((1 << n) - 1 << k) + self.get(n + k)


class _BitWriter:
    def __init__(self):
        self.bits = []

    def put(self, v: int, n: int):
        self.bits += [(v >> i) & 1 for i in range(n)]

    def eg(self, v: int, k: int):
        n = ((v >> k) + 1).bit_length() - 1
        self.put((1 << n) - 1, n + 1)
        self.put(v - ((1 << n) - 1 << k), n + k)

    def to_bytes(self) -> bytes:
        bits = self.bits + [0] * (-len(self.bits) % 8)
        return bytes(sum(bits[i + j] << j for j in range(8)) for i in range(0, len(bits), 8))


def level_value(q: int, b: int) -> int:
    return q if q < 2 << b else ((1 << b) + q % (1 << b)) << (q // (1 << b) - 1)


def zigzag(d: int) -> int:
    return 2 * d if d >= 0 else -2 * d - 1


def read_rans_table(bits: _BitReader, M: int):
    b, k = bits.get(2), bits.get(2)
    present, pos, first, absent = [], 0, True, True
    while pos < 256:
        v = bits.eg(2)
        length = v if first else v + 1
        first = False
        if pos + length > 256:
            raise ValueError("runs past 255")
        if not absent:
            present += range(pos, pos + length)
        pos, absent = pos + length, not absent
    if not present:
        raise ValueError("table without symbols")
    levels, q = [], 0
    for _ in present:
        z = bits.eg(k)
        q += z // 2 if z % 2 == 0 else -(z + 1) // 2
        if q < 1 or level_value(q, b) > M:
            raise ValueError("level out of range")
        levels.append(q)
    r = levels.index(max(levels))
    f = [0] * 256
    for i, s in enumerate(present):
        if i != r:
            f[s] = level_value(levels[i], b)
    if M - sum(f) < 1:
        raise ValueError("frequencies exceed M")
    f[present[r]] = M - sum(f)
    return f


def rans_decode(payload: bytes, n: int, columns: int) -> bytes:
    mode = payload[0]
    P, G = mode & 15, (mode >> 4 & 3) + 1
    if mode >> 6:
        raise ValueError("mode bits 6-7")
    M, pos, ids = 1 << P, 1, [0] * max(columns, 1)
    if G > 1:
        raw = payload[pos:pos + (columns + 3) // 4]
        if len(raw) < (columns + 3) // 4:
            raise ValueError("truncated ids")
        ids = [raw[c // 4] >> 2 * (c % 4) & 3 for c in range(columns)]
        if any(i >= G for i in ids) or (columns % 4 and raw[-1] >> 2 * (columns % 4)):
            raise ValueError("bad group ids")
        pos += len(raw)
    bits = _BitReader(payload[pos:])
    tables = [read_rans_table(bits, M) for _ in range(G)]
    if bits.pos % 8 and bits.get(8 - bits.pos % 8):
        raise ValueError("padding bits")
    pos += bits.pos // 8
    if len(payload) - pos < 32:
        raise ValueError("truncated states")
    x = list(struct.unpack_from("<8I", payload, pos))
    pos += 32
    if min(x) < L_RANS:
        raise ValueError("state below L")
    owners = [[s for s in range(256) for _ in range(f[s])] for f in tables]
    cums = [[sum(f[:s]) for s in range(256)] for f in tables]
    out = bytearray(n)
    for i in range(n):
        j, t = i % 8, ids[i % columns]
        slot = x[j] % M
        s = owners[t][slot]
        out[i] = s
        x[j] = tables[t][s] * (x[j] // M) + slot - cums[t][s]
        if x[j] < L_RANS:
            if pos + 2 > len(payload):
                raise ValueError("words run out")
            x[j] = x[j] << 16 | int.from_bytes(payload[pos:pos + 2], "little")
            pos += 2
    if pos != len(payload) or any(v != L_RANS for v in x):
        raise ValueError("words left over or final states not L")
    return bytes(out)


def rans_encode(data: bytes, columns: int, P: int, tables, ids=None) -> bytes:
    """The informative encoder of the document. tables: (b, k, {symbol: level}) per table."""
    M, G = 1 << P, len(tables)
    w = _BitWriter()
    freqs = []
    for b, k, levels in tables:
        w.put(b, 2)
        w.put(k, 2)
        present = sorted(levels)
        runs, pos = [], 0
        for s in present:
            if runs and s == runs[-1][1]:
                runs[-1][1] += 1
            else:
                runs.append([s, s + 1])
        first = True
        for start, end in runs:
            w.eg(start - pos - (0 if first else 1), 2)
            w.eg(end - start - 1, 2)
            pos, first = end, False
        if pos < 256:
            w.eg(256 - pos - 1, 2)
        q = 0
        for s in present:
            w.eg(zigzag(levels[s] - q), k)
            q = levels[s]
        r = max(present, key=lambda s: (levels[s], -s))
        f = [0] * 256
        for s in present:
            if s != r:
                f[s] = level_value(levels[s], b)
        f[r] = M - sum(f)
        freqs.append(f)
    head = bytes([P | (G - 1) << 4])
    if G > 1:
        packed = bytearray((columns + 3) // 4)
        for c, g in enumerate(ids):
            packed[c // 4] |= g << 2 * (c % 4)
        head += bytes(packed)
    x, words = [L_RANS] * 8, []
    for i in reversed(range(len(data))):
        j, f = i % 8, freqs[ids[i % columns] if G > 1 else 0]
        s = data[i]
        if x[j] >= f[s] << (32 - P):
            words.append(x[j] & 0xFFFF)
            x[j] >>= 16
        x[j] = x[j] // f[s] * M + x[j] % f[s] + sum(f[:s])
    return head + w.to_bytes() + struct.pack("<8I", *x) + b"".join(struct.pack("<H", v) for v in reversed(words))


def _unpredict(raw: bytes, predictor: int, n: int, C: int, mask: int) -> bytes:
    if predictor == 0:
        return raw
    if predictor == 3:
        ref, R = raw[:C], raw[C:]
        other = 0xFF & ~(0x80 | mask)
        return bytes(((R[i] ^ ref[i % C]) & 0x80) | (((R[i] & mask) + (ref[i % C] & mask)) & mask) | (R[i] & other)
                     for i in range(n * C))
    P = bytearray(raw)
    for i in range(C, n * C):
        P[i] = P[i] ^ P[i - C] if predictor == 1 else (P[i] + P[i - C]) & 0xFF
    return bytes(P)


def reference_decode(frame: bytes, rans_modes=None) -> bytes:
    """The decoded array bytes of a frame, per the document (zstd payloads via zstandard); the mode
    byte of every rANS payload is appended to rans_modes."""
    import zstandard

    assert frame[:5] == b"GEAR\x01"
    etype, ndim = frame[5], frame[6]
    block_tokens = struct.unpack_from("<I", frame, 8)[0]
    dims = struct.unpack_from(f"<{ndim}I", frame, 12)
    mask = 0x7F if etype in (2, 3) else 0x7C
    C = dims[-1] if ndim > 1 else 1
    if etype in (4, 5):  # quantised rows: codes, scale low bytes, scale high bytes
        assert C % 32 == 0
        widths = [C if etype == 4 else C // 2, C // 32, C // 32]
    else:
        widths = [C] * (4 if etype == 3 else 2)
    row_bytes = sum(widths)
    tokens = dims[-2] if ndim > 1 else dims[0]
    slices = int(np.prod(dims[:-2])) if ndim > 2 else 1
    pos, out = 24 + 4 * ndim, bytearray()

    def stream(columns):
        nonlocal pos
        predictor, backend, raw_len, payload_len = struct.unpack_from("<BBII", frame, pos)
        payload = frame[pos + 10:pos + 10 + payload_len]
        pos += 10 + payload_len
        if backend == 0:
            raw = payload
        elif backend == 1:
            raw, i = bytearray(), 0
            while i < len(payload):
                c = payload[i]
                if c < 128:
                    raw += payload[i + 1:i + 2 + c]
                    i += 2 + c
                else:
                    raw += bytes([payload[i + 1]]) * (c - 125)
                    i += 2
        elif backend == 2:
            raw = zstandard.ZstdDecompressor().decompress(payload, max_output_size=raw_len)
        else:
            raw = rans_decode(payload, raw_len, columns)
            if rans_modes is not None:
                rans_modes.append(payload[0])
        assert len(raw) == raw_len
        return predictor, bytes(raw)

    prev_map = None
    for _ in range(slices):
        flags = frame[pos]
        pos += 1
        assert flags in (0, 1, 3)
        rows, row_map = tokens, None
        if flags == 3:  # dedup with the previous slice's map
            row_map = prev_map
            assert row_map
            rows = 1 + max(row_map)
        elif flags & 1:
            w = 1 if tokens <= 256 else 2 if tokens <= 65536 else 4
            _, m = stream(1)
            row_map = [int.from_bytes(m[t * w:t * w + w], "little") for t in range(tokens)]
            rows = 1 + max(row_map) if tokens else 0
        prev_map = row_map
        unique = bytearray()
        for b0 in range(0, rows, block_tokens):
            n = min(block_tokens, rows - b0)
            planes = []
            for w in widths:
                predictor, raw = stream(w)
                planes.append(_unpredict(raw, predictor, n, w, mask))
            if etype in (4, 5):
                codes, lo, hi = planes
                K, S = widths[0], widths[1]
                for t in range(n):
                    unique += codes[t * K:(t + 1) * K]
                    unique += bytes(b for g in range(S) for b in (lo[t * S + g], hi[t * S + g]))
            else:
                unique += bytes(planes[k][i] for i in range(n * C) for k in range(len(widths)))
        if row_map is None:
            out += unique
        else:
            for t in range(tokens):
                out += unique[row_map[t] * row_bytes:(row_map[t] + 1) * row_bytes]
    assert pos == len(frame)
    return bytes(out)

def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def kv_like(tokens=256, channels=64, heads=2, seed=0, repeat_rows=False) -> np.ndarray:
    """Gaussian values with per-channel scales over four decades (the K cache's outlier channels)."""
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-2, 2, size=(heads, 1, channels))
    a = (rng.standard_normal((heads, tokens, channels)) * scale).astype(np.float16)
    if repeat_rows:
        src = rng.integers(0, tokens // 4, size=tokens)
        a = a[:, src]
    return np.ascontiguousarray(a)


def test_xxh64_matches_reference_and_zstd():
    import zstandard

    from mnn_h2o import _core
    for data in (b"", b"a", b"abc", bytes(range(256)), np.random.default_rng(1).bytes(1000)):
        assert _core.xxh64(data) == xxh64(data)
        # A zstd frame's content checksum is the low 32 bits of XXH64.
        frame = zstandard.ZstdCompressor(write_checksum=True).compress(data)
        assert int.from_bytes(frame[-4:], "little") == xxh64(data) & 0xFFFFFFFF


def frame_header(element_type: int, dims, block_tokens: int, data: bytes) -> bytes:
    h = b"GEAR" + bytes([1, element_type, len(dims), 0]) + struct.pack("<I", block_tokens)
    h += b"".join(struct.pack("<I", d) for d in dims) + struct.pack("<Q", xxh64(data))
    return h + struct.pack("<I", xxh64(h) & 0xFFFFFFFF)


def stream(predictor: int, backend: int, raw_len: int, payload: bytes) -> bytes:
    return bytes([predictor, backend]) + struct.pack("<II", raw_len, len(payload)) + payload


def test_decodes_the_documented_example():
    a = np.array([[1.0, -2.0], [1.0, -2.0]], dtype=np.float16)
    frame = (frame_header(1, (2, 2), 2, a.tobytes()) + b"\x00"
             + stream(0, 0, 4, bytes(4)) + stream(0, 0, 4, bytes([0x3C, 0xC0, 0x3C, 0xC0])))
    assert len(frame) == 32 + 1 + 14 + 14
    assert same_bits(codec.decode(frame), a)


def test_decodes_hand_built_fp32_frame_with_rle_and_centre():
    # FP32 [3][1]: 1.0, 2.0, 4.0 (3F800000, 40000000, 40800000). Planes 0 and 1 are zero (RLE
    # repeat run of 3), plane 2 is 80 00 80 (stored), plane 3 (3F 40 40) centred on ref 40:
    # sign same, field 3F-40 = 7F, then 00 00.
    a = np.array([[1.0], [2.0], [4.0]], dtype=np.float32)
    frame = (frame_header(3, (3, 1), 64, a.tobytes()) + b"\x00"
             + stream(0, 1, 3, bytes([128, 0])) + stream(0, 1, 3, bytes([128, 0]))
             + stream(0, 0, 3, bytes([0x80, 0x00, 0x80]))
             + stream(3, 0, 4, bytes([0x40, 0x7F, 0x00, 0x00])))
    assert same_bits(codec.decode(frame), a)
    info = codec.inspect(frame)
    assert [(s["predictor"], s["backend"]) for s in info["streams"]] == [
        ("raw", "rle"), ("raw", "rle"), ("raw", "stored"), ("centre", "stored")]


def test_decodes_the_documented_rans_example():
    a = np.array([[1.0], [1.0], [1.0], [-1.0]], dtype=np.float16)
    payload = rans_encode(bytes([0x3C, 0x3C, 0x3C, 0xBC]), 1, 2, [(0, 1, {0x3C: 2, 0xBC: 1})])
    assert payload == bytes.fromhex("02 f4007c023c2305" + "55550100" * 3 + "03000400" + "00000100" * 4)
    frame = (frame_header(1, (4, 1), 4, a.tobytes()) + b"\x00"
             + stream(0, 0, 4, bytes(4)) + stream(0, 3, 4, payload))
    assert same_bits(codec.decode(frame), a)
    assert reference_decode(frame) == a.tobytes()
    assert [s["backend"] for s in codec.inspect(frame)["streams"]] == ["stored", "rans"]


def _random_rans_tables(rng, P, G, alphabet_size):
    """G valid tables: random levels, the remainder symbol's level the largest."""
    M, tables = 1 << P, []
    for _ in range(G):
        b = int(rng.integers(0, 4))
        K = int(rng.integers(1, alphabet_size + 1))
        symbols = [int(v) for v in rng.choice(256, size=K, replace=False)]
        small = max(q for q in range(1, 200) if level_value(q, b) <= max(1, M // (2 * K)))
        levels = {v: int(rng.integers(1, small + 1)) for v in symbols}
        r = symbols[int(rng.integers(0, K))]
        levels[r] = max(levels.values()) + int(rng.integers(0, 2))
        while level_value(levels[r], b) > M:
            levels[r] -= 1
        tables.append((b, int(rng.integers(0, 4)), levels))
    return tables


def test_reference_rans_payloads_decode_natively():
    """Payloads of the document's reference encoder (random tables, groups and precisions)."""
    rng = np.random.default_rng(5)
    for _ in range(40):
        C, tokens = int(rng.integers(1, 10)), int(rng.integers(1, 40))
        G = int(rng.integers(1, 5)) if C > 1 else 1
        P = int(rng.integers(6, 16))
        tables = _random_rans_tables(rng, P, G, 40)
        ids = [int(rng.integers(0, G)) for _ in range(C)] if G > 1 else None
        plane1 = bytes(int(rng.choice(sorted(tables[ids[i % C] if ids else 0][2]))) for i in range(tokens * C))
        payload = rans_encode(plane1, C, P, tables, ids)
        assert rans_decode(payload, len(plane1), C) == plane1
        plane0 = rng.bytes(tokens * C)
        a = np.frombuffer(bytes(v for pair in zip(plane0, plane1) for v in pair), dtype=np.float16).reshape(tokens, C)
        frame = (frame_header(1, (tokens, C), tokens, a.tobytes()) + b"\x00"
                 + stream(0, 0, len(plane0), plane0) + stream(0, 3, len(plane1), payload))
        assert same_bits(codec.decode(frame), a)
        for cut in (1, 2, 33):  # any missing byte is an error
            with pytest.raises(GearError):
                codec.decode(frame[:-cut])


def _two_kinds_of_channels(tokens, seed):
    """Half the channels narrow (few distinct values), half wide: per-channel tables pay."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((2, tokens, 32)).astype(np.float32)
    a[..., ::2] = np.round(a[..., ::2] * 2) / 8
    return a.astype(np.float16)


@pytest.mark.parametrize("make,block_tokens", [
    (lambda: kv_like(tokens=512, channels=32, heads=2, seed=1), 0),
    (lambda: kv_like(tokens=256, channels=32, heads=2, seed=2, repeat_rows=True), 64),
    (lambda: _two_kinds_of_channels(300, 3), 0),
    (lambda: _two_kinds_of_channels(300, 4).astype(np.float32), 128),
])
def test_frames_match_the_reference_decoder(make, block_tokens):
    a = make()
    frame = codec.encode(a, block_tokens=block_tokens)
    assert reference_decode(frame) == a.tobytes()
    assert any(s["backend"] == "rans" for s in codec.inspect(frame)["streams"])


def test_rans_groups_pay_on_channels_that_differ():
    a = _two_kinds_of_channels(512, 6)
    frame = codec.encode(a)
    modes = []
    assert reference_decode(frame, rans_modes=modes) == a.tobytes()
    assert any(m >> 4 > 0 for m in modes)  # more than one table
    assert len(frame) < len(codec.encode(a, allow_zstd=False, allow_rans=False))


def test_rans_works_without_zstd_and_alone():
    a = kv_like(tokens=256)
    for options in ({"allow_zstd": False}, {"allow_zstd": False, "allow_rle": False}):
        frame = codec.encode(a, **options)
        assert {s["backend"] for s in codec.inspect(frame)["streams"] if s["kind"] == "plane1"} == {"rans"}
        assert same_bits(codec.decode(frame), a)
    no_rans = codec.encode(a, allow_rans=False)
    assert "rans" not in {s["backend"] for s in codec.inspect(no_rans)["streams"]}
    assert len(codec.encode(a)) < len(no_rans)


@pytest.mark.parametrize("dtype,element_type", [(np.float16, None), (np.float32, None), (np.uint16, "bf16")])
@pytest.mark.parametrize("shape", [(7,), (1, 1), (64, 64), (3, 100, 64), (2, 3, 5, 4), (0, 8), (5, 0)])
@pytest.mark.parametrize("block_tokens", [0, 1, 64])
def test_round_trip_all_bit_patterns(dtype, element_type, shape, block_tokens):
    rng = np.random.default_rng(hash((shape, block_tokens)) & 0xFFFF)
    itemsize = np.dtype(dtype).itemsize
    a = rng.integers(0, 256, size=int(np.prod(shape)) * itemsize, dtype=np.uint8).view(dtype).reshape(shape)
    frame = codec.encode(a, element_type=element_type, block_tokens=block_tokens)
    b = codec.decode(frame)
    assert b.dtype == (np.uint16 if element_type == "bf16" else dtype)
    assert same_bits(a, b)


def q8_rows(tokens=128, heads=2, channels=64, seed=0, kind="q8"):
    """Quantised KV rows [heads, tokens, row bytes] as the cache writes them (outlier channels)."""
    from mnn_h2o import _core

    x = kv_like(tokens=tokens, channels=channels, heads=heads, seed=seed).astype(np.float32)
    rows = _core.kv_rows_encode(kind, x.reshape(-1, channels))
    return rows.reshape(heads, tokens, -1)


def test_decodes_the_documented_q8_example():
    row = bytes((i - 16) & 0xFF for i in range(32)) + b"\x00\x2c"
    frame = frame_header(4, (1, 32), 1, row) + b"\x00"
    frame += struct.pack("<BBII", 0, 0, 32, 32) + row[:32]
    frame += struct.pack("<BBII", 0, 0, 1, 1) + row[32:33]
    frame += struct.pack("<BBII", 0, 0, 1, 1) + row[33:34]
    assert codec.decode(frame).tobytes() == row
    assert codec.decode(frame).shape == (1, 34)
    info = codec.inspect(frame)
    assert info["element_type"] == "q8" and info["shape"] == (1, 32) and info["decoded_size"] == 34
    assert reference_decode(frame) == row


@pytest.mark.parametrize("kind,block_tokens", [("q8", 0), ("q4", 0), ("q8", 48)])
def test_quantised_rows_round_trip_and_match_the_reference_decoder(kind, block_tokens):
    rows = q8_rows(kind=kind)
    rows[:, 100:] = rows[:, :28]  # repeated rows: dedup
    frame = codec.encode(rows, element_type=kind, block_tokens=block_tokens)
    assert same_bits(codec.decode(frame), rows)
    assert reference_decode(frame) == rows.tobytes()
    info = codec.inspect(frame)
    assert info["shape"] == rows.shape[:2] + (64,) and info["decoded_size"] == rows.nbytes
    assert info["ratio"] > 1.0 and info["summary"]["dedup_slices"] == 2
    assert {s["kind"] for s in info["streams"]} == {"map", "shared_map", "plane0", "plane1", "plane2"}
    # Any bytes at all round-trip (the codec never reads codes or scales as numbers).
    noise = np.random.default_rng(1).integers(0, 256, size=(3, 17, 2 * rows.shape[-1]), dtype=np.uint8)
    assert same_bits(codec.decode(codec.encode(noise, element_type=kind)), noise)


def test_quantised_rows_bad_arguments():
    with pytest.raises(ValueError, match="uint8"):
        codec.encode(np.zeros((4, 68), np.int8), element_type="q8")
    with pytest.raises(ValueError, match="multiple of 34"):
        codec.encode(np.zeros((4, 60), np.uint8), element_type="q8")
    with pytest.raises(ValueError, match="row bytes"):
        codec.encode(np.zeros(68, np.uint8), element_type="q8")


def test_special_values_are_bit_exact():
    bits = np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE5A, 0x7D23, 0x0001, 0x83FF,
                     0x03FF, 0x3C00, 0x7BFF, 0xFBFF], dtype=np.uint16)
    a = np.tile(bits, (32, 4)).view(np.float16)  # NaN payloads, +-inf, subnormals, -0, max
    for options in ({}, {"allow_zstd": False}, {"predictors": ("raw", "centre")}, {"dedup": False}):
        assert same_bits(codec.decode(codec.encode(a, **options)), a)
    f32 = np.array([[np.nan, -0.0, np.inf, -np.inf, 1e-45, -3.4e38]], dtype=np.float32)
    f32.view(np.uint32)[0, 0] = 0x7FA00001  # a signalling NaN with a payload
    assert same_bits(codec.decode(codec.encode(f32)), f32)


def test_kv_like_data_compresses_and_uses_the_exponent_model():
    a = kv_like()
    frame = codec.encode(a)
    info = codec.inspect(frame)
    assert info["ratio"] > 1.1
    top = [s for s in info["streams"] if s["kind"] == "plane1"]
    assert all(s["predictor"] == "centre" and s["backend"] == "rans" for s in top)
    assert info["summary"]["dedup_slices"] == 0


def test_repeated_rows_are_deduplicated():
    a = kv_like(repeat_rows=True)
    frame = codec.encode(a)
    info = codec.inspect(frame)
    assert info["summary"]["dedup_slices"] == a.shape[0]
    assert len(frame) < len(codec.encode(a, dedup=False))
    assert same_bits(codec.decode(frame), a)


def test_heads_with_the_same_repeats_share_one_map():
    """Layer 0: every head repeats the same tokens, so only the first slice writes its map."""
    a = kv_like(repeat_rows=True, heads=3)
    info = codec.inspect(codec.encode(a))
    assert info["summary"]["dedup_slices"] == 3 and info["summary"]["shared_maps"] == 2
    assert [s["kind"] for s in info["streams"] if s["block"] < 0] == ["map", "shared_map", "shared_map"]
    # Other repeats in the middle head: it writes its own map, and so does the last head, whose
    # map is compared with the one right before it
    b = a.copy()
    b[1] = b[1][np.random.default_rng(1).permutation(b.shape[1])]
    info = codec.inspect(codec.encode(b))
    assert [s["kind"] for s in info["streams"] if s["block"] < 0] == ["map", "map", "map"]
    for x in (a, b):
        frame = codec.encode(x)
        assert same_bits(codec.decode(frame), x)
        assert reference_decode(frame) == x.tobytes()


def test_inspect_reports_modes_and_sizes():
    a = kv_like(tokens=128, heads=1)
    frame = codec.encode(a, block_tokens=64)
    info = codec.inspect(frame)
    assert info["shape"] == a.shape and info["element_type"] == "fp16" and info["block_tokens"] == 64
    assert info["frame_size"] == len(frame) and info["decoded_size"] == a.nbytes
    assert len(info["streams"]) == 2 * 2  # 2 blocks x 2 planes
    assert info["data_checksum"] == xxh64(a.tobytes())
    payload = sum(info["summary"]["payload_bytes"].values())
    assert payload + info["summary"]["header_bytes"] + 1 + 4 * 10 == len(frame)


def test_damaged_frames_raise_or_decode_exactly():
    a = kv_like(tokens=48, channels=8, heads=2, repeat_rows=True)
    frame = bytearray(codec.encode(a, block_tokens=16))
    rng = np.random.default_rng(3)
    for pos in range(len(frame)):
        bad = bytearray(frame)
        bad[pos] ^= int(rng.integers(1, 256))
        try:
            b = codec.decode(bytes(bad))
        except GearError:
            continue
        assert same_bits(a, b), f"damage at byte {pos} decoded to other data"
    for n in range(len(frame)):
        with pytest.raises(GearError):
            codec.decode(bytes(frame[:n]))
    with pytest.raises(GearError, match="corrupt"):
        codec.decode(bytes(frame) + b"\x00")


def test_codec_object_reuse_and_decode_into():
    c = codec.Codec(predictors=("raw", "centre"), block_tokens=64)
    out = np.empty((2, 256, 64), dtype=np.float16)
    for seed in range(3):
        a = kv_like(seed=seed)
        c.decode_into(c.encode(a), out)
        assert same_bits(a, out)
    with pytest.raises(GearError, match="too small"):
        c.decode_into(c.encode(kv_like()), np.empty((10,), dtype=np.float16))


def test_bad_arguments():
    with pytest.raises(ValueError):
        codec.encode(np.zeros(4, dtype=np.int32))
    with pytest.raises(ValueError):
        codec.encode(np.zeros(4, dtype=np.float16), element_type="fp8")
    with pytest.raises(ValueError):
        codec.encode(np.zeros(4, dtype=np.float16), predictors=("lz77",))
    with pytest.raises(GearError, match="bad magic"):
        codec.decode(b"NOPE" + bytes(40))


def test_evaluator_core_on_a_tiny_cache():
    from mnn_h2o.tools import kv_codec_eval as ev

    kv = [(kv_like(tokens=96, channels=16, heads=2, seed=i),
           kv_like(tokens=96, channels=16, heads=2, seed=10 + i, repeat_rows=i == 0)) for i in range(3)]
    r = ev.evaluate(kv, block_tokens=32, repeats=1, block_sizes=(32, 0), slow_baselines=False, progress=False)
    assert r["tokens"] == 96 and len(r["layers"]) == 3
    agg = r["aggregate"]
    for key in ("all", "K", "V", "layers_0_1"):
        assert agg[key]["gear"] > 1.0 and agg[key]["zstd3"] > 0
    assert agg["layers_0_1"]["gear"] > agg["all"]["gear"] * 0.9
    assert r["speed"]["encode_MBps"] > 0 and r["speed"]["decode_MBps"] > 0
    assert "no dedup" in r["ablations"] and "block_tokens 32" in r["ablations"]
    assert "Gear on 96 tokens" in ev.format_table(r)
