// Python face of the Gear codec (native/include/mnn_h2o/codec/gear_codec.h): buffers in, bytes out.
// mnn_h2o/codec.py builds the user-facing API (numpy dtypes, option names) on top.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <vector>

#include "mnn_h2o/codec/gear_codec.h"
#include "mnn_h2o/codec/xxhash64.h"

namespace py = pybind11;
using namespace mnn_h2o::gear;

namespace {

struct GearError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void check(Status s) {
    if (s != Status::Ok) throw GearError(status_name(s));
}

Shape to_shape(const std::vector<uint32_t>& dims) {
    if (dims.empty() || dims.size() > kMaxDims) throw py::value_error("Gear arrays have 1 to 8 dimensions");
    Shape s;
    s.ndim = static_cast<uint32_t>(dims.size());
    std::copy(dims.begin(), dims.end(), s.dims);
    return s;
}

py::dict frame_info_dict(const FrameInfo& fi) {
    py::dict d;
    d["element_type"] = static_cast<int>(fi.element_type);
    d["shape"] = std::vector<uint32_t>(fi.shape.dims, fi.shape.dims + fi.shape.ndim);
    d["block_tokens"] = fi.block_tokens;
    d["data_checksum"] = fi.data_checksum;
    d["header_size"] = fi.header_size;
    d["decoded_size"] = fi.decoded_size;
    return d;
}

// The buffer of a C-contiguous object (numpy array, bytes, bytearray, memoryview).
py::buffer_info contiguous(const py::buffer& b, bool writable = false) {
    py::buffer_info info = b.request(writable);
    py::ssize_t expect = info.itemsize;
    for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
        if (info.shape[i] > 1 && info.strides[i] != expect) throw py::value_error("buffer must be C-contiguous");
        expect *= info.shape[i];
    }
    return info;
}

}  // namespace

void bind_codec(py::module_& m) {
    py::register_exception<GearError>(m, "GearError", PyExc_ValueError);

    const EncodeOptions kDefaults;  // the keyword defaults: the codec's own
    py::class_<Codec>(m, "GearCodec",
                      "A reusable Gear encoder/decoder (scratch buffers, zstd contexts). Not thread-safe.")
        .def(py::init([](uint32_t predictors, bool allow_rle, bool allow_zstd, bool allow_rans,
                         int zstd_level, uint32_t block_tokens, bool dedup) {
                 EncodeOptions o;
                 o.predictors = predictors;
                 o.allow_rle = allow_rle;
                 o.allow_zstd = allow_zstd;
                 o.allow_rans = allow_rans;
                 o.zstd_level = zstd_level;
                 o.block_tokens = block_tokens;
                 o.dedup = dedup;
                 return new Codec(o);
             }),
             py::arg("predictors") = kDefaults.predictors, py::arg("allow_rle") = kDefaults.allow_rle,
             py::arg("allow_zstd") = kDefaults.allow_zstd, py::arg("allow_rans") = kDefaults.allow_rans,
             py::arg("zstd_level") = kDefaults.zstd_level, py::arg("block_tokens") = kDefaults.block_tokens,
             py::arg("dedup") = kDefaults.dedup)
        .def(
            "encode",
            [](Codec& c, const py::buffer& data, int element_type, const std::vector<uint32_t>& dims) {
                const Shape shape = to_shape(dims);
                const auto type = static_cast<ElementType>(element_type);
                const py::buffer_info in = contiguous(data);
                const uint64_t channels = shape.ndim == 1 ? 1 : shape.dims[shape.ndim - 1];
                uint64_t row = 0;
                if (!row_bytes(type, channels, &row))
                    throw py::value_error("unknown element type, or channels not a multiple of its group");
                const uint64_t bytes = channels ? shape.elements() / channels * row : 0;  // rows x row bytes
                if (static_cast<uint64_t>(in.size * in.itemsize) != bytes)
                    throw py::value_error("buffer size does not match shape and element type");
                std::vector<uint8_t> out;
                Status s;
                {
                    py::gil_scoped_release nogil;
                    s = c.encode(in.ptr, type, shape, &out);
                }
                check(s);
                return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
            },
            py::arg("data"), py::arg("element_type"), py::arg("shape"))
        .def(
            "decode_into",
            [](Codec& c, const py::buffer& frame, const py::buffer& out) {
                const py::buffer_info in = contiguous(frame);
                py::buffer_info o = contiguous(out, true);
                Status s;
                {
                    py::gil_scoped_release nogil;
                    s = c.decode(static_cast<const uint8_t*>(in.ptr), in.size * in.itemsize, o.ptr,
                                 o.size * o.itemsize);
                }
                check(s);
            },
            py::arg("frame"), py::arg("out"), "Decode a frame into a writable buffer of the decoded size.")
        .def(
            "inspect",
            [](Codec& c, const py::buffer& frame) {
                const py::buffer_info in = contiguous(frame);
                FrameInfo fi;
                std::vector<StreamInfo> streams;
                check(c.inspect(static_cast<const uint8_t*>(in.ptr), in.size * in.itemsize, &fi, &streams));
                py::dict d = frame_info_dict(fi);
                py::list l;
                for (const StreamInfo& st : streams) {
                    py::dict e;
                    e["slice"] = st.slice;
                    e["block"] = st.block;
                    e["plane"] = st.plane;
                    e["predictor"] = static_cast<int>(st.predictor);
                    e["backend"] = static_cast<int>(st.backend);
                    e["raw_len"] = st.raw_len;
                    e["payload_len"] = st.payload_len;
                    l.append(e);
                }
                d["streams"] = l;
                return d;
            },
            py::arg("frame"), "Header and every stream's modes and sizes; checks the structure.");

    m.def(
        "gear_frame_info",
        [](const py::buffer& frame) {
            const py::buffer_info in = contiguous(frame);
            FrameInfo fi;
            check(read_frame_info(static_cast<const uint8_t*>(in.ptr), in.size * in.itemsize, &fi));
            return frame_info_dict(fi);
        },
        py::arg("frame"));
    m.def("gear_zstd_available", &zstd_available, "True when libzstd.so.1 could be loaded.");
    m.def(
        "xxh64",
        [](const py::buffer& data, uint64_t seed) {
            const py::buffer_info in = contiguous(data);
            return mnn_h2o::xxh64(in.ptr, in.size * in.itemsize, seed);
        },
        py::arg("data"), py::arg("seed") = 0);
}
