/* Internal to the float64 reference (src/reference): its allocator. */
#ifndef WKV_REF_ALLOC_H
#define WKV_REF_ALLOC_H

#include <stddef.h>
#include <stdint.h>

/* calloc of max(count, 1) elements of `elem` bytes (zeroed); prints a message and aborts when
 * the memory is not there. Released with free(). */
void* wkv_ref_alloc(int64_t count, size_t elem);

#endif
