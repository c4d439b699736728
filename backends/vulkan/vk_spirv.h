/* The SPIR-V of every shader variant, embedded at build time. The variants are listed once,
 * in shaders/shaders.cmake (name, source, defines); CMake compiles each with glslangValidator,
 * checks it with spirv-val and writes the table below into wkv_vk_spirv.c. */
#ifndef WKV_VK_SPIRV_H
#define WKV_VK_SPIRV_H

#include <stddef.h>
#include <stdint.h>

typedef struct wkv_vk_spirv {
    const char* name; /* e.g. "wkv7_fwd", "wkv7_fwd_s16" */
    const uint32_t* code;
    size_t size;      /* bytes */
} wkv_vk_spirv;

extern const wkv_vk_spirv wkv_vk_spirv_table[];
extern const size_t wkv_vk_spirv_count;

#endif
