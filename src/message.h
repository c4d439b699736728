/* Formatting failure messages into a wkv_message. */
#ifndef WKV_SRC_MESSAGE_H
#define WKV_SRC_MESSAGE_H

#include "backend.h"

#if defined(__GNUC__)
#define WKV_PRINTF(fmt_index, args_index) __attribute__((format(printf, fmt_index, args_index)))
#else
#define WKV_PRINTF(fmt_index, args_index)
#endif

/* Writes the formatted message into msg and returns status, so a check reads
 *     if (bad) return wkv_fail(msg, WKV_ERROR_SHAPE, "r.shape[1] is %lld, ...", ...); */
wkv_status wkv_fail(wkv_message* msg, wkv_status status, const char* fmt, ...) WKV_PRINTF(3, 4);

#endif
