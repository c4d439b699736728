/* A defensive safetensors reader: see safetensors.h. */
#include "safetensors.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"

/* The reference implementation refuses headers above 100 MB; so do we. */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* JSON nesting allowed in values we skip (unknown keys). */
#define ST_MAX_DEPTH 64

typedef struct st_meta_entry {
    char* key;
    char* value;
} st_meta_entry;

struct st_file {
    unsigned char* image; /* the whole file */
    size_t size;
    const unsigned char* data; /* start of the data section */
    size_t data_size;
    st_tensor* tensors;
    size_t num_tensors, cap_tensors;
    st_meta_entry* meta;
    size_t num_meta, cap_meta;
};

/* ------------------------------------------------------------------------------ dtypes */

static const struct {
    const char* name;
    size_t size;
} st_dtypes[ST_DTYPE_COUNT_] = {
    [ST_BOOL] = {"BOOL", 1},    [ST_U8] = {"U8", 1},     [ST_I8] = {"I8", 1},
    [ST_F8_E5M2] = {"F8_E5M2", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1},
    [ST_U16] = {"U16", 2},      [ST_I16] = {"I16", 2},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},    [ST_U32] = {"U32", 4},   [ST_I32] = {"I32", 4},
    [ST_F32] = {"F32", 4},      [ST_U64] = {"U64", 8},   [ST_I64] = {"I64", 8},
    [ST_F64] = {"F64", 8},
};

const char* st_dtype_name(st_dtype dtype) {
    if ((int)dtype < 0 || dtype >= ST_DTYPE_COUNT_) return "?";
    return st_dtypes[dtype].name;
}

size_t st_dtype_size(st_dtype dtype) {
    if ((int)dtype < 0 || dtype >= ST_DTYPE_COUNT_) return 0;
    return st_dtypes[dtype].size;
}

int st_dtype_is_float(st_dtype dtype) {
    return dtype == ST_F16 || dtype == ST_BF16 || dtype == ST_F32 || dtype == ST_F64;
}

/* ------------------------------------------------------------------------------ errors */

static void st_set_err(char* err, size_t errlen, const char* fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------- JSON parser */

typedef struct st_parser {
    const char* p;   /* current position */
    const char* beg; /* header start (for error positions) */
    const char* end; /* header end */
    char* err;
    size_t errlen;
    int failed;
} st_parser;

static int st_fail(st_parser* ps, const char* what) {
    if (!ps->failed) {
        st_set_err(ps->err, ps->errlen, "malformed header JSON at byte %ld: %s",
                   (long)(ps->p - ps->beg), what);
        ps->failed = 1;
    }
    return -1;
}

static void st_ws(st_parser* ps) {
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

/* Skips whitespace, then consumes c if it is next. */
static int st_accept(st_parser* ps, char c) {
    st_ws(ps);
    if (ps->p < ps->end && *ps->p == c) {
        ps->p++;
        return 1;
    }
    return 0;
}

static int st_expect(st_parser* ps, char c) {
    if (st_accept(ps, c)) return 0;
    char msg[48];
    if (ps->p >= ps->end)
        snprintf(msg, sizeof msg, "expected '%c', found the end of the header", c);
    else
        snprintf(msg, sizeof msg, "expected '%c'", c);
    return st_fail(ps, msg);
}

static int st_hex4(st_parser* ps, uint32_t* out) {
    if (ps->end - ps->p < 4) return st_fail(ps, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = ps->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return st_fail(ps, "bad hex digit in \\u escape");
    }
    ps->p += 4;
    *out = v;
    return 0;
}

/* Parses a JSON string at the cursor. With out != NULL, stores a malloc'd UTF-8 copy
 * (escapes decoded; a decoded NUL is refused since the result is a C string). */
static int st_string(st_parser* ps, char** out) {
    if (out) *out = NULL;
    if (!st_accept(ps, '"')) return st_fail(ps, "expected a string");
    /* The decoded string is never longer than the encoded one. */
    const char* q = ps->p;
    while (q < ps->end && *q != '"') q += (*q == '\\' && q + 1 < ps->end) ? 2 : 1;
    if (q >= ps->end) return st_fail(ps, "unterminated string");
    size_t cap = (size_t)(q - ps->p) + 1;
    char* buf = NULL;
    if (out) {
        buf = (char*)malloc(cap);
        if (!buf) return st_fail(ps, "out of memory");
    }
    size_t n = 0;
    for (;;) {
        if (ps->p >= ps->end) {
            free(buf);
            return st_fail(ps, "unterminated string");
        }
        unsigned char c = (unsigned char)*ps->p++;
        if (c == '"') break;
        if (c < 0x20) {
            free(buf);
            ps->p--;
            return st_fail(ps, "control character inside a string");
        }
        if (c != '\\') {
            if (buf) buf[n] = (char)c;
            n++;
            continue;
        }
        if (ps->p >= ps->end) {
            free(buf);
            return st_fail(ps, "unterminated escape");
        }
        char e = *ps->p++;
        uint32_t cp;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (st_hex4(ps, &cp)) {
                free(buf);
                return -1;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* high surrogate: a low one must follow */
                uint32_t lo;
                if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                    free(buf);
                    return st_fail(ps, "unpaired UTF-16 surrogate");
                }
                ps->p += 2;
                if (st_hex4(ps, &lo)) {
                    free(buf);
                    return -1;
                }
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    free(buf);
                    return st_fail(ps, "unpaired UTF-16 surrogate");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(buf);
                return st_fail(ps, "unpaired UTF-16 surrogate");
            }
            if (cp == 0) {
                free(buf);
                return st_fail(ps, "\\u0000 inside a string");
            }
            break;
        default:
            free(buf);
            ps->p--;
            return st_fail(ps, "unknown escape in a string");
        }
        /* UTF-8 encode cp. An escape takes >= 2 input bytes (\uXXXX: 6, pairs: 12) and
         * produces <= 4 output bytes (<= 3 for a single \uXXXX), so n stays below cap. */
        unsigned char tmp[4];
        size_t len;
        if (cp < 0x80) {
            tmp[0] = (unsigned char)cp;
            len = 1;
        } else if (cp < 0x800) {
            tmp[0] = (unsigned char)(0xC0 | (cp >> 6));
            tmp[1] = (unsigned char)(0x80 | (cp & 0x3F));
            len = 2;
        } else if (cp < 0x10000) {
            tmp[0] = (unsigned char)(0xE0 | (cp >> 12));
            tmp[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            tmp[2] = (unsigned char)(0x80 | (cp & 0x3F));
            len = 3;
        } else {
            tmp[0] = (unsigned char)(0xF0 | (cp >> 18));
            tmp[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
            tmp[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            tmp[3] = (unsigned char)(0x80 | (cp & 0x3F));
            len = 4;
        }
        if (buf) {
            if (n + len >= cap) { /* cannot happen (see above); stay safe regardless */
                free(buf);
                return st_fail(ps, "internal: string buffer overflow");
            }
            memcpy(buf + n, tmp, len);
        }
        n += len;
    }
    if (buf) {
        buf[n] = '\0';
        if (strlen(buf) != n) { /* a raw NUL byte inside the header */
            free(buf);
            return st_fail(ps, "NUL byte inside a string");
        }
        *out = buf;
    }
    return 0;
}

/* A non-negative integer without sign, fraction or exponent, at most INT64_MAX. */
static int st_uint(st_parser* ps, uint64_t* out) {
    st_ws(ps);
    const char* s = ps->p;
    if (s >= ps->end || *s < '0' || *s > '9')
        return st_fail(ps, "expected a non-negative integer");
    uint64_t v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        unsigned d = (unsigned)(*ps->p - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10) return st_fail(ps, "integer too large");
        v = v * 10 + d;
        ps->p++;
    }
    if (ps->p - s > 1 && *s == '0') {
        ps->p = s;
        return st_fail(ps, "integer with a leading zero");
    }
    if (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E'))
        return st_fail(ps, "expected an integer, found a fraction or exponent");
    *out = v;
    return 0;
}

/* Skips any JSON number (grammar checked). */
static int st_skip_number(st_parser* ps) {
    const char* p = ps->p;
    const char* e = ps->end;
    if (p < e && *p == '-') p++;
    if (p >= e || *p < '0' || *p > '9') return st_fail(ps, "bad number");
    if (*p == '0') p++;
    else
        while (p < e && *p >= '0' && *p <= '9') p++;
    if (p < e && *p == '.') {
        p++;
        if (p >= e || *p < '0' || *p > '9') return st_fail(ps, "bad number");
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') return st_fail(ps, "bad number");
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    ps->p = p;
    return 0;
}

static int st_skip_value(st_parser* ps, int depth) {
    if (depth > ST_MAX_DEPTH) return st_fail(ps, "nesting too deep");
    st_ws(ps);
    if (ps->p >= ps->end) return st_fail(ps, "expected a value, found the end of the header");
    char c = *ps->p;
    if (c == '"') return st_string(ps, NULL);
    if (c == '{') {
        ps->p++;
        if (st_accept(ps, '}')) return 0;
        do {
            if (st_string(ps, NULL) || st_expect(ps, ':') || st_skip_value(ps, depth + 1))
                return -1;
        } while (st_accept(ps, ','));
        return st_expect(ps, '}');
    }
    if (c == '[') {
        ps->p++;
        if (st_accept(ps, ']')) return 0;
        do {
            if (st_skip_value(ps, depth + 1)) return -1;
        } while (st_accept(ps, ','));
        return st_expect(ps, ']');
    }
    static const char* const lits[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t len = strlen(lits[i]);
        if ((size_t)(ps->end - ps->p) >= len && memcmp(ps->p, lits[i], len) == 0) {
            ps->p += len;
            return 0;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) return st_skip_number(ps);
    return st_fail(ps, "expected a value");
}

/* --------------------------------------------------------------------- header contents */

static int st_push_tensor(st_file* f, const st_tensor* t) {
    if (f->num_tensors == f->cap_tensors) {
        size_t cap = f->cap_tensors ? f->cap_tensors * 2 : 16;
        st_tensor* n = (st_tensor*)realloc(f->tensors, cap * sizeof *n);
        if (!n) return -1;
        f->tensors = n;
        f->cap_tensors = cap;
    }
    f->tensors[f->num_tensors++] = *t;
    return 0;
}

static int st_push_meta(st_file* f, char* key, char* value) {
    if (f->num_meta == f->cap_meta) {
        size_t cap = f->cap_meta ? f->cap_meta * 2 : 16;
        st_meta_entry* n = (st_meta_entry*)realloc(f->meta, cap * sizeof *n);
        if (!n) return -1;
        f->meta = n;
        f->cap_meta = cap;
    }
    f->meta[f->num_meta].key = key;
    f->meta[f->num_meta].value = value;
    f->num_meta++;
    return 0;
}

static int st_parse_metadata(st_parser* ps, st_file* f) {
    if (st_expect(ps, '{')) return -1;
    if (st_accept(ps, '}')) return 0;
    do {
        char *key = NULL, *value = NULL;
        if (st_string(ps, &key)) return -1;
        if (st_expect(ps, ':')) {
            free(key);
            return -1;
        }
        st_ws(ps);
        if (ps->p >= ps->end || *ps->p != '"') {
            free(key);
            return st_fail(ps, "__metadata__ values must be strings");
        }
        if (st_string(ps, &value)) {
            free(key);
            return -1;
        }
        if (st_meta(f, key)) {
            st_set_err(ps->err, ps->errlen, "duplicate __metadata__ key \"%s\"", key);
            ps->failed = 1;
            free(key);
            free(value);
            return -1;
        }
        if (st_push_meta(f, key, value)) {
            free(key);
            free(value);
            return st_fail(ps, "out of memory");
        }
    } while (st_accept(ps, ','));
    return st_expect(ps, '}');
}

/* Parses {"dtype":..., "shape":[...], "data_offsets":[b,e]} for tensor `name` (owned by the
 * caller until this succeeds). */
static int st_parse_tensor(st_parser* ps, st_file* f, char* name) {
    st_tensor t;
    memset(&t, 0, sizeof t);
    t.name = name;
    int have_dtype = 0, have_shape = 0, have_offsets = 0;
    uint64_t begin = 0, end = 0;
    if (st_expect(ps, '{')) return -1;
    if (!st_accept(ps, '}')) {
        do {
            char* key = NULL;
            if (st_string(ps, &key)) return -1;
            if (st_expect(ps, ':')) {
                free(key);
                return -1;
            }
            int rc = 0;
            if (strcmp(key, "dtype") == 0) {
                char* dt = NULL;
                if (have_dtype) rc = st_fail(ps, "duplicate \"dtype\"");
                else if (st_string(ps, &dt)) rc = -1;
                else {
                    int found = -1;
                    for (int i = 0; i < ST_DTYPE_COUNT_; i++)
                        if (strcmp(dt, st_dtypes[i].name) == 0) found = i;
                    if (found < 0) {
                        st_set_err(ps->err, ps->errlen, "tensor \"%s\": unknown dtype \"%.32s\"",
                                   name, dt);
                        ps->failed = 1;
                        rc = -1;
                    } else {
                        t.dtype = (st_dtype)found;
                        have_dtype = 1;
                    }
                    free(dt);
                }
            } else if (strcmp(key, "shape") == 0) {
                if (have_shape) rc = st_fail(ps, "duplicate \"shape\"");
                else if (st_expect(ps, '[')) rc = -1;
                else if (!st_accept(ps, ']')) {
                    do {
                        uint64_t d;
                        if (t.ndim >= ST_MAX_DIMS) {
                            rc = st_fail(ps, "too many dimensions (more than 8)");
                            break;
                        }
                        if (st_uint(ps, &d)) {
                            rc = -1;
                            break;
                        }
                        t.shape[t.ndim++] = (int64_t)d;
                    } while (st_accept(ps, ','));
                    if (!rc) rc = st_expect(ps, ']');
                }
                have_shape = !rc;
            } else if (strcmp(key, "data_offsets") == 0) {
                if (have_offsets) rc = st_fail(ps, "duplicate \"data_offsets\"");
                else if (st_expect(ps, '[') || st_uint(ps, &begin) || st_expect(ps, ',') ||
                         st_uint(ps, &end) || st_expect(ps, ']'))
                    rc = -1;
                have_offsets = !rc;
            } else {
                rc = st_skip_value(ps, 2); /* unknown key: tolerated */
            }
            free(key);
            if (rc) return -1;
        } while (st_accept(ps, ','));
        if (st_expect(ps, '}')) return -1;
    }
    if (!have_dtype || !have_shape || !have_offsets) {
        st_set_err(ps->err, ps->errlen, "tensor \"%s\": missing \"%s\"", name,
                   !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
        ps->failed = 1;
        return -1;
    }
    /* element count and byte size, overflow-checked */
    uint64_t numel = 1;
    for (int i = 0; i < t.ndim; i++) {
        uint64_t d = (uint64_t)t.shape[i];
        if (d != 0 && numel > (uint64_t)INT64_MAX / d) {
            st_set_err(ps->err, ps->errlen, "tensor \"%s\": element count overflows", name);
            ps->failed = 1;
            return -1;
        }
        numel *= d;
    }
    uint64_t esize = st_dtypes[t.dtype].size;
    if (numel > (uint64_t)INT64_MAX / esize) {
        st_set_err(ps->err, ps->errlen, "tensor \"%s\": byte size overflows", name);
        ps->failed = 1;
        return -1;
    }
    uint64_t nbytes = numel * esize;
    if (begin > end) {
        st_set_err(ps->err, ps->errlen, "tensor \"%s\": data_offsets [%llu, %llu] begin after end",
                   name, (unsigned long long)begin, (unsigned long long)end);
        ps->failed = 1;
        return -1;
    }
    if (end > (uint64_t)f->data_size) {
        st_set_err(ps->err, ps->errlen,
                   "tensor \"%s\": data_offsets [%llu, %llu] outside the %llu data bytes", name,
                   (unsigned long long)begin, (unsigned long long)end,
                   (unsigned long long)f->data_size);
        ps->failed = 1;
        return -1;
    }
    if (end - begin != nbytes) {
        st_set_err(ps->err, ps->errlen,
                   "tensor \"%s\": data_offsets span %llu bytes, but %s%s needs %llu", name,
                   (unsigned long long)(end - begin), st_dtypes[t.dtype].name,
                   t.ndim ? " of its shape" : " scalar", (unsigned long long)nbytes);
        ps->failed = 1;
        return -1;
    }
    if (st_find(f, name)) {
        st_set_err(ps->err, ps->errlen, "duplicate tensor \"%s\"", name);
        ps->failed = 1;
        return -1;
    }
    t.numel = (int64_t)numel;
    t.nbytes = (size_t)nbytes;
    t.data = f->data + begin;
    if (st_push_tensor(f, &t)) return st_fail(ps, "out of memory");
    return 0;
}

static int st_parse_header(st_file* f, const char* hdr, size_t len, char* err, size_t errlen) {
    st_parser ps = {hdr, hdr, hdr + len, err, errlen, 0};
    if (st_expect(&ps, '{')) return -1;
    int have_meta = 0;
    if (!st_accept(&ps, '}')) {
        do {
            char* key = NULL;
            if (st_string(&ps, &key)) return -1;
            if (st_expect(&ps, ':')) {
                free(key);
                return -1;
            }
            if (strcmp(key, "__metadata__") == 0) {
                free(key);
                if (have_meta) return st_fail(&ps, "duplicate __metadata__");
                have_meta = 1;
                if (st_parse_metadata(&ps, f)) return -1;
            } else if (st_parse_tensor(&ps, f, key)) {
                free(key);
                return -1;
            }
        } while (st_accept(&ps, ','));
        if (st_expect(&ps, '}')) return -1;
    }
    st_ws(&ps);
    if (ps.p != ps.end) return st_fail(&ps, "trailing bytes after the JSON object");
    return 0;
}

/* ---------------------------------------------------------------------------- open/close */

/* Takes ownership of image (malloc'd). */
static st_file* st_open_image(unsigned char* image, size_t size, char* err, size_t errlen) {
    if (size < 8) {
        st_set_err(err, errlen, "file too short (%zu bytes): no 8-byte header length", size);
        free(image);
        return NULL;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | image[i];
    if (n > (uint64_t)(size - 8)) {
        st_set_err(err, errlen, "header length %llu exceeds the %zu bytes after it",
                   (unsigned long long)n, size - 8);
        free(image);
        return NULL;
    }
    if (n > ST_MAX_HEADER) {
        st_set_err(err, errlen, "header length %llu exceeds the 100 MB limit",
                   (unsigned long long)n);
        free(image);
        return NULL;
    }
    if (n < 2) {
        st_set_err(err, errlen, "header length %llu is too small for a JSON object",
                   (unsigned long long)n);
        free(image);
        return NULL;
    }
    st_file* f = (st_file*)calloc(1, sizeof *f);
    if (!f) {
        st_set_err(err, errlen, "out of memory");
        free(image);
        return NULL;
    }
    f->image = image;
    f->size = size;
    f->data = image + 8 + n;
    f->data_size = size - 8 - (size_t)n;
    if (st_parse_header(f, (const char*)image + 8, (size_t)n, err, errlen)) {
        st_close(f);
        return NULL;
    }
    return f;
}

st_file* st_open_memory(const void* data, size_t size, char* err, size_t errlen) {
    if (!data && size) {
        st_set_err(err, errlen, "NULL data");
        return NULL;
    }
    unsigned char* image = (unsigned char*)malloc(size ? size : 1);
    if (!image) {
        st_set_err(err, errlen, "out of memory (%zu bytes)", size);
        return NULL;
    }
    if (size) memcpy(image, data, size);
    return st_open_image(image, size, err, errlen);
}

st_file* st_open(const char* path, char* err, size_t errlen) {
    if (!path) {
        st_set_err(err, errlen, "NULL path");
        return NULL;
    }
    FILE* fp = fopen(path, "rb");
    if (!fp) {
        st_set_err(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    /* Read in chunks rather than trusting ftell (works for pipes and special files too). */
    size_t cap = 1 << 16, size = 0;
    unsigned char* image = (unsigned char*)malloc(cap);
    if (!image) {
        fclose(fp);
        st_set_err(err, errlen, "out of memory");
        return NULL;
    }
    for (;;) {
        if (size == cap) {
            if (cap > SIZE_MAX / 2) {
                free(image);
                fclose(fp);
                st_set_err(err, errlen, "%s: file too large", path);
                return NULL;
            }
            unsigned char* grown = (unsigned char*)realloc(image, cap * 2);
            if (!grown) {
                free(image);
                fclose(fp);
                st_set_err(err, errlen, "%s: out of memory reading the file", path);
                return NULL;
            }
            image = grown;
            cap *= 2;
        }
        size_t got = fread(image + size, 1, cap - size, fp);
        size += got;
        if (got == 0) break;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(image);
        st_set_err(err, errlen, "error reading %s", path);
        return NULL;
    }
    st_file* f = st_open_image(image, size, err, errlen);
    if (!f && err && errlen) { /* prefix the path */
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s", err);
        st_set_err(err, errlen, "%s: %s", path, tmp);
    }
    return f;
}

void st_close(st_file* f) {
    if (!f) return;
    for (size_t i = 0; i < f->num_tensors; i++) free((char*)f->tensors[i].name);
    for (size_t i = 0; i < f->num_meta; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->tensors);
    free(f->meta);
    free(f->image);
    free(f);
}

/* --------------------------------------------------------------------------------- query */

size_t st_count(const st_file* f) { return f ? f->num_tensors : 0; }

const st_tensor* st_at(const st_file* f, size_t i) {
    return (f && i < f->num_tensors) ? &f->tensors[i] : NULL;
}

const st_tensor* st_find(const st_file* f, const char* name) {
    if (!f || !name) return NULL;
    for (size_t i = 0; i < f->num_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char* st_meta(const st_file* f, const char* key) {
    if (!f || !key) return NULL;
    for (size_t i = 0; i < f->num_meta; i++)
        if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
    return NULL;
}

size_t st_meta_count(const st_file* f) { return f ? f->num_meta : 0; }

int st_meta_at(const st_file* f, size_t i, const char** key, const char** value) {
    if (!f || i >= f->num_meta) return 0;
    if (key) *key = f->meta[i].key;
    if (value) *value = f->meta[i].value;
    return 1;
}

/* ---------------------------------------------------------------------------- conversion */

static double st_elem_f64(const st_tensor* t, int64_t i) {
    const unsigned char* p = (const unsigned char*)t->data;
    switch (t->dtype) {
    case ST_F64: {
        double d;
        memcpy(&d, p + 8 * i, 8);
        return d;
    }
    case ST_F32: {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case ST_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return wkv_f16_to_f32(h);
    }
    case ST_BF16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return wkv_bf16_to_f32(h);
    }
    default: return 0.0;
    }
}

int st_tensor_to_f64(const st_tensor* t, double* out) {
    if (!t || !out || !st_dtype_is_float(t->dtype)) return -1;
    if (t->dtype == ST_F64) {
        memcpy(out, t->data, t->nbytes);
        return 0;
    }
    for (int64_t i = 0; i < t->numel; i++) out[i] = st_elem_f64(t, i);
    return 0;
}

int st_tensor_to_f32(const st_tensor* t, float* out) {
    if (!t || !out || !st_dtype_is_float(t->dtype)) return -1;
    if (t->dtype == ST_F32) {
        memcpy(out, t->data, t->nbytes);
        return 0;
    }
    for (int64_t i = 0; i < t->numel; i++) out[i] = (float)st_elem_f64(t, i);
    return 0;
}
