/* The float64 reference's one allocator (rwkv4.c, rwkv6.c, rwkv7.c).
 *
 * This is test/tool code, never part of libwkv: it assumes allocations succeed, and if one
 * fails it prints a message and calls abort() (it never returns with outputs half written). */
#include <stdio.h>
#include <stdlib.h>

#include "ref_alloc.h"

void* wkv_ref_alloc(int64_t count, size_t elem) {
    const size_t n = (size_t)(count > 0 ? count : 1);
    void* p = calloc(n, elem);
    if (!p) {
        fprintf(stderr, "libwkv reference: out of memory (%zu x %zu bytes)\n", n, elem);
        abort();
    }
    return p;
}
