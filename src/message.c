#include "message.h"

#include <stdarg.h>
#include <stdio.h>

wkv_status wkv_fail(wkv_message* msg, wkv_status status, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg->text, sizeof msg->text, fmt, ap);
    va_end(ap);
    return status;
}
