/* A small, defensive reader for safetensors files.
 *
 *   char err[256];
 *   st_file* f = st_open("case.safetensors", err, sizeof err);
 *   if (!f) { fprintf(stderr, "%s\n", err); ... }
 *   const st_tensor* t = st_find(f, "y");          // NULL when absent
 *   const char* op = st_meta(f, "op");             // NULL when absent
 *   double* buf = malloc(t->numel * sizeof *buf);
 *   st_tensor_to_f64(t, buf);                      // any float dtype -> double
 *   st_close(f);
 *
 * Format: an unsigned 64-bit little-endian header length n, n bytes of JSON, then the raw
 * little-endian data. The JSON is one object mapping each tensor name to
 * {"dtype": "...", "shape": [...], "data_offsets": [begin, end]} (offsets relative to the end of
 * the header, row-major) plus an optional "__metadata__" object of string values.
 *
 * Everything is checked before it is used: the header length against the file size, the JSON
 * syntax (nesting depth, escapes, UTF-16 surrogates, trailing bytes), each dtype name, each
 * shape (non-negative, overflow-free element count), and each data range (inside the data,
 * begin <= end, and exactly numel * element size long). Duplicate names are rejected. On any
 * problem st_open returns NULL and writes a one-line reason into err; it never aborts.
 *
 * The whole file is read into memory; tensor data is owned by the st_file and lives until
 * st_close. Tensor data is not guaranteed to be aligned: read it with memcpy or with the
 * conversion helpers below. */
#ifndef WKV_TOOLS_SAFETENSORS_H
#define WKV_TOOLS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { ST_MAX_DIMS = 8 };

typedef enum st_dtype {
    ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_U16, ST_I16, ST_F16, ST_BF16,
    ST_U32, ST_I32, ST_F32, ST_U64, ST_I64, ST_F64,
    ST_DTYPE_COUNT_
} st_dtype;

typedef struct st_tensor {
    const char* name;
    st_dtype dtype;
    int ndim;                    /* 0 (a scalar) .. ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;               /* product of shape (1 for a scalar) */
    const void* data;            /* not necessarily aligned */
    size_t nbytes;               /* numel * st_dtype_size(dtype) */
} st_tensor;

typedef struct st_file st_file;

/* Opens and validates a file. NULL on failure, with the reason in err (if err != NULL). */
st_file* st_open(const char* path, char* err, size_t errlen);
/* The same for a file image in memory (copied; the caller keeps `data`). */
st_file* st_open_memory(const void* data, size_t size, char* err, size_t errlen);
void st_close(st_file* f); /* accepts NULL */

/* Tensors, in the order of the header. */
size_t st_count(const st_file* f);
const st_tensor* st_at(const st_file* f, size_t i);
const st_tensor* st_find(const st_file* f, const char* name); /* NULL when absent */

/* __metadata__ entries (NULL when absent). */
const char* st_meta(const st_file* f, const char* key);
size_t st_meta_count(const st_file* f);
/* The i-th entry; returns 0 when i is out of range. */
int st_meta_at(const st_file* f, size_t i, const char** key, const char** value);

/* "F32", "BF16", ...; "?" for an out-of-range value. */
const char* st_dtype_name(st_dtype dtype);
size_t st_dtype_size(st_dtype dtype); /* bytes per element; 0 for an out-of-range value */
int st_dtype_is_float(st_dtype dtype); /* F16, BF16, F32, F64 */

/* Converts every element of a float tensor (F16, BF16, F32, F64) into out[numel].
 * Returns 0, or -1 (nothing written) for any other dtype. */
int st_tensor_to_f64(const st_tensor* t, double* out);
int st_tensor_to_f32(const st_tensor* t, float* out);

#ifdef __cplusplus
}
#endif

#endif /* WKV_TOOLS_SAFETENSORS_H */
