// Every golden file through the CPU backend in f32, f16 and bf16 (tools/common/golden.c, the
// same checker as `wkv-bench golden`), and the safetensors reader against malformed files.
#include "wkv_doctest.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "golden.h"
#include "safetensors.h"
#include "wkv/wkv.h"

namespace {

namespace fs = std::filesystem;

std::vector<std::string> list_golden() {
    char** paths = nullptr;
    size_t count = 0;
    char err[512] = "";
    std::vector<std::string> out;
    if (wkv_golden_list(wkv_golden_dir(), &paths, &count, err, sizeof err) != 0) {
        FAIL_CHECK("cannot list the golden directory: " << err);
        return out;
    }
    for (size_t i = 0; i < count; i++) out.emplace_back(paths[i]);
    wkv_golden_list_free(paths, count);
    return out;
}

std::string base_name(const std::string& p) { return fs::path(p).filename().string(); }

std::string line_of(const wkv_golden_result& r) {
    char buf[1024];
    wkv_golden_format(&r, buf, sizeof buf);
    return buf;
}

wkv_backend_info cpu_info() {
    wkv_backend_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    wkv_status s = wkv_backend_get_info(WKV_BACKEND_CPU, &info);
    REQUIRE_MESSAGE(s == WKV_OK, "wkv_backend_get_info(CPU): " << std::string(wkv_last_error(nullptr)));
    return info;
}

// A safetensors image: 8-byte little-endian header length, the header, the data.
std::string image(const std::string& header, const std::string& data, uint64_t hlen) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; i++) out[i] = static_cast<char>((hlen >> (8 * i)) & 0xFF);
    return out + header + data;
}
std::string image(const std::string& header, const std::string& data) {
    return image(header, data, header.size());
}

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() /
               ("wkv_test_golden_" + std::to_string(static_cast<long long>(getpid())));
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string write(const std::string& name, const std::string& bytes) const {
        fs::path p = path / name;
        std::ofstream f(p, std::ios::binary);
        f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        return p.string();
    }
};

std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("golden: every file, f32/f16/bf16, on the CPU backend") {
    const wkv_backend_info info = cpu_info();
    const std::vector<std::string> files = list_golden();
    INFO("golden directory: " << std::string(wkv_golden_dir()));
    REQUIRE(!files.empty());
    int wkv7_files = 0;
    const wkv_dtype dtypes[3] = {WKV_DTYPE_F32, WKV_DTYPE_F16, WKV_DTYPE_BF16};
    for (const std::string& path : files) {
        for (const wkv_dtype& dt : dtypes) {
            wkv_golden_result r;
            wkv_golden_run(path.c_str(), WKV_BACKEND_CPU, dt, &r);
            const std::string line = base_name(path) + "  " + line_of(r);
            INFO(line);
            REQUIRE_MESSAGE(r.status != WKV_GOLDEN_ERROR, "the file could not be used");
            if (dt.bits == 32 && r.op == WKV_OP_RWKV7) wkv7_files++;
            char why[128] = "";
            const bool claimed = wkv_golden_backend_claims(&info, &r, why, sizeof why) != 0;
            if (r.op == WKV_OP_RWKV7) CHECK_MESSAGE(claimed, "the CPU backend must run RWKV-7: " << why);
            if (claimed) {
                CHECK(r.status == WKV_GOLDEN_PASS);
            } else {
                // Not claimed (op, dtype, decay form or head size): the library must say
                // WKV_ERROR_UNSUPPORTED; once it claims the case, the branch above demands a PASS.
                INFO("not claimed by the CPU backend: " << why);
                CHECK(r.status == WKV_GOLDEN_UNSUPPORTED);
            }
            CHECK(r.backend == WKV_BACKEND_CPU);
        }
    }
    CHECK(wkv7_files >= 1);
}

TEST_CASE("golden: RWKV-7 with key-major states on the CPU backend") {
    for (const std::string& path : list_golden()) {
        if (base_name(path).rfind("wkv7", 0) != 0) continue;
        wkv_golden_options o;
        std::memset(&o, 0, sizeof o);
        o.backend = WKV_BACKEND_CPU;
        o.dtype = WKV_DTYPE_F32;
        o.state_key_major = 1;
        wkv_golden_result r;
        wkv_golden_run_ex(path.c_str(), &o, &r);
        INFO(base_name(path) << "  " << line_of(r));
        CHECK(r.status == WKV_GOLDEN_PASS);
    }
}

TEST_CASE("golden: the float64 reference the 16-bit checks rely on matches the files") {
    for (const std::string& path : list_golden()) {
        wkv_golden_result r;
        wkv_golden_run_reference(path.c_str(), &r);
        INFO(base_name(path) << "  " << std::string(wkv_golden_status_name(r.status)) << " max_rel_err="
                             << r.max_rel_err << " (" << std::string(r.worst) << ") " << std::string(r.message));
        REQUIRE(r.status != WKV_GOLDEN_ERROR);
        if (r.op == WKV_OP_RWKV7) CHECK(r.status == WKV_GOLDEN_PASS);
        else CHECK((r.status == WKV_GOLDEN_PASS || r.status == WKV_GOLDEN_UNSUPPORTED));
    }
}

TEST_CASE("safetensors: malformed files give an error, never a crash") {
    TempDir tmp;
    const std::string ok_tensor = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    const std::string data8(8, '\0');

    struct Case {
        const char* name;
        std::string bytes;
    };
    std::vector<Case> bad = {
        {"empty", ""},
        {"short_length", std::string("\x05\x00\x00", 3)},
        {"length_past_end", image(ok_tensor, data8, 10000)},
        {"length_huge", image(ok_tensor, data8, ~0ull)},
        {"length_zero", image("", data8, 0)},
        {"json_not_object", image("[1,2,3]", "")},
        {"json_truncated", image(R"({"x":{"dtype":"F32","shape":[2],)", data8)},
        {"json_garbage", image("{\"x\": @@@}", data8)},
        {"json_trailing", image(ok_tensor + " junk", data8)},
        {"json_bad_escape", image(R"({"__metadata__":{"a":"\q"}})", "")},
        {"json_unterminated_string", image(R"({"__metadata__":{"a":"b})", "")},
        {"json_nul_in_header", image(std::string("{\"a\0\":1}", 9), "")},
        {"json_deep", image("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"z\":" +
                                std::string(100000, '[') + "}}",
                            data8)},
        {"offsets_past_end", image(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data8)},
        {"offsets_reversed", image(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data8)},
        {"offsets_huge", image(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551000,18446744073709551008]}})", data8)},
        {"shape_mismatch", image(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8)},
        {"shape_negative", image(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8)},
        {"shape_overflow", image(R"({"x":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", data8)},
        {"dtype_unknown", image(R"({"x":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", data8)},
        {"dtype_missing", image(R"({"x":{"shape":[2],"data_offsets":[0,8]}})", data8)},
        {"duplicate_tensor", image(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data8)},
        {"metadata_not_string", image(R"({"__metadata__":{"op":7}})", "")},
    };
    // A real golden file, truncated inside the header and inside the data.
    char** paths = nullptr;
    size_t count = 0;
    char err[512] = "";
    if (wkv_golden_list(wkv_golden_dir(), &paths, &count, err, sizeof err) == 0 && count > 0) {
        std::string real = read_all(paths[0]);
        REQUIRE(real.size() > 64);
        bad.push_back({"truncated_header", real.substr(0, 40)});
        bad.push_back({"truncated_data", real.substr(0, real.size() / 2)});
        bad.push_back({"truncated_last_byte", real.substr(0, real.size() - 1)});
    }
    wkv_golden_list_free(paths, count);

    for (const Case& c : bad) {
        INFO("case " << c.name);
        const std::string path = tmp.write(std::string(c.name) + ".safetensors", c.bytes);
        char msg[512] = "";
        st_file* f = st_open(path.c_str(), msg, sizeof msg);
        CHECK(f == nullptr);
        CHECK(std::strlen(msg) > 0);
        st_close(f);
        // ... and from memory
        f = st_open_memory(c.bytes.data(), c.bytes.size(), msg, sizeof msg);
        CHECK(f == nullptr);
        st_close(f);
        // the golden checker reports it as an error
        wkv_golden_result r;
        CHECK(wkv_golden_run(path.c_str(), WKV_BACKEND_CPU, WKV_DTYPE_F32, &r) == WKV_GOLDEN_ERROR);
        CHECK(std::strlen(r.message) > 0);
    }

    // Nonexistent file.
    {
        char msg[512] = "";
        CHECK(st_open((tmp.path / "missing.safetensors").string().c_str(), msg, sizeof msg) == nullptr);
        CHECK(std::strlen(msg) > 0);
    }

    // Valid files still open: a minimal one, with unicode metadata and an ignored extra key.
    {
        const std::string hdr =
            R"({"__metadata__":{"k":"\u00e9\ud83d\ude00"},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":[1,{"q":null}]}}  )";
        std::string data(8, '\0');
        const float vals[2] = {1.5f, -2.0f};
        std::memcpy(&data[0], vals, 8);
        const std::string bytes = image(hdr, data);
        char msg[256] = "";
        st_file* f = st_open_memory(bytes.data(), bytes.size(), msg, sizeof msg);
        REQUIRE_MESSAGE(f != nullptr, msg);
        CHECK(st_count(f) == 1);
        CHECK(std::string(st_meta(f, "k")) == "\xc3\xa9\xf0\x9f\x98\x80");
        const st_tensor* t = st_find(f, "x");
        REQUIRE(t != nullptr);
        CHECK(t->dtype == ST_F32);
        CHECK(t->ndim == 1);
        CHECK(t->numel == 2);
        double out[2];
        CHECK(st_tensor_to_f64(t, out) == 0);
        CHECK(out[0] == 1.5);
        CHECK(out[1] == -2.0);
        CHECK(st_find(f, "y") == nullptr);
        CHECK(st_meta(f, "nope") == nullptr);
        st_close(f);
    }

    // Deterministic mutations of a real header: every one either opens or fails cleanly.
    paths = nullptr;
    count = 0;
    if (wkv_golden_list(wkv_golden_dir(), &paths, &count, err, sizeof err) == 0 && count > 0) {
        const std::string real = read_all(paths[count - 1]);
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | static_cast<unsigned char>(real[i]);
        REQUIRE(hlen + 8 <= real.size());
        uint64_t x = 0x9E3779B97F4A7C15ull;
        auto next = [&x]() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            return x;
        };
        static const char specials[] = "{}[]\":,\\-.0123456789eE \x01\xff";
        int opened = 0;
        for (int it = 0; it < 3000; it++) {
            std::string m = real;
            int edits = 1 + static_cast<int>(next() % 3);
            for (int e = 0; e < edits; e++) {
                size_t pos = 8 + static_cast<size_t>(next() % hlen);
                m[pos] = (next() & 1) ? specials[next() % (sizeof specials - 1)]
                                      : static_cast<char>(next() & 0xFF);
            }
            char msg[256] = "";
            st_file* f = st_open_memory(m.data(), m.size(), msg, sizeof msg);
            if (f) {
                opened++;
                for (size_t i = 0; i < st_count(f); i++) {  // every tensor in bounds
                    const st_tensor* t = st_at(f, i);
                    if (!st_dtype_is_float(t->dtype)) continue;
                    std::vector<double> buf(static_cast<size_t>(t->numel));
                    st_tensor_to_f64(t, buf.data());
                }
            } else {
                CHECK(std::strlen(msg) > 0);
            }
            st_close(f);
        }
        MESSAGE("header mutations: " << opened << " of 3000 still valid");
    }
    wkv_golden_list_free(paths, count);
}

TEST_CASE("golden: files that are valid safetensors but not valid golden files") {
    TempDir tmp;
    auto f32 = [](const char* name, const char* shape, size_t begin, size_t end) {
        return std::string("\"") + name + "\":{\"dtype\":\"F32\",\"shape\":" + shape +
               ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
    };
    const std::string meta_ok =
        R"("__metadata__":{"op":"wkv7","decay_form":"log","B":"1","T":"1","H":"1","N":"1"})";
    std::string tensors;
    const char* names[] = {"r", "w", "k", "v", "a", "b"};
    for (int i = 0; i < 6; i++) tensors += "," + f32(names[i], "[1,1,1,1]", 4 * i, 4 * i + 4);
    const std::string data(24, '\0');
    struct Case {
        const char* name;
        std::string header;
        const char* expect;  // part of the message
    };
    const std::vector<Case> cases = {
        {"no_op", "{" + tensors.substr(1) + "}", "op"},
        {"unknown_op", R"({"__metadata__":{"op":"wkv5"})" + tensors + "}", "unknown op"},
        {"bad_decay_form",
         R"({"__metadata__":{"op":"wkv7","decay_form":"cubic","B":"1","T":"1","H":"1","N":"1"})" +
             tensors + "}",
         "decay_form"},
        {"bad_dim",
         R"({"__metadata__":{"op":"wkv7","decay_form":"log","B":"1","T":"x","H":"1","N":"1"})" +
             tensors + "}",
         "\"T\""},
        {"missing_tensor", "{" + meta_ok + tensors + "}", "missing tensor"},
        {"wrong_shape",
         R"({"__metadata__":{"op":"wkv7","decay_form":"log","B":"1","T":"2","H":"1","N":"1"})" +
             tensors + "}",
         "shape"},
    };
    for (const Case& c : cases) {
        INFO("case " << c.name);
        const std::string path = tmp.write(std::string(c.name) + ".safetensors", image(c.header, data));
        wkv_golden_result r;
        CHECK(wkv_golden_run(path.c_str(), WKV_BACKEND_CPU, WKV_DTYPE_F32, &r) == WKV_GOLDEN_ERROR);
        INFO("message: " << std::string(r.message));
        CHECK(std::string(r.message).find(c.expect) != std::string::npos);
    }
}
