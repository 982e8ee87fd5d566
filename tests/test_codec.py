"""The Gear codec from Python: bit-exact round trips, hand-built frames, damage, inspect, and the
offline evaluator's core on a tiny synthetic cache."""
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
    if codec.zstd_available():
        assert all(s["predictor"] == "centre" and s["backend"] == "zstd" for s in top)
    assert info["summary"]["dedup_slices"] == 0


def test_repeated_rows_are_deduplicated():
    a = kv_like(repeat_rows=True)
    frame = codec.encode(a)
    info = codec.inspect(frame)
    assert info["summary"]["dedup_slices"] == a.shape[0]
    assert len(frame) < len(codec.encode(a, dedup=False))
    assert same_bits(codec.decode(frame), a)


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
