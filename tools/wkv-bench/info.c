/* wkv-bench info: version, build, and for each backend whether it is usable and what it
 * supports. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "wkv_tools.h"

static void info_usage(FILE* f) {
    fprintf(f,
            "usage: wkv-bench info\n"
            "\n"
            "Prints the libwkv version and build, then for each backend (cpu, cuda, vulkan):\n"
            "whether it is available (or why not), its devices (name, memory, compute units),\n"
            "and the ops, dtypes, decay forms and head sizes it supports; last, the backend an\n"
            "AUTO context picks here.\n");
}

static void print_memory(uint64_t bytes) {
    if (!bytes) return;
    double gib = (double)bytes / (1024.0 * 1024.0 * 1024.0);
    if (gib >= 1.0) printf(", %.1f GiB", gib);
    else printf(", %.0f MiB", (double)bytes / (1024.0 * 1024.0));
}

int bench_info(int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        if (bench_is_help(argv[i])) {
            info_usage(stdout);
            return BENCH_OK;
        }
        return bench_usage_error("info", "unknown argument '%s'", argv[i]);
    }
    uint32_t v = wkv_version();
    printf("libwkv %s (library %u.%u.%u, header %d.%d.%d)\n", wkv_version_string(), v / 10000,
           v / 100 % 100, v % 100, WKV_VERSION_MAJOR, WKV_VERSION_MINOR, WKV_VERSION_PATCH);
    printf("build: %s\n", wkv_build_info());
    printf("backends:\n");
    const wkv_backend all[] = {WKV_BACKEND_CPU, WKV_BACKEND_CUDA, WKV_BACKEND_VULKAN};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        wkv_backend_info bi;
        memset(&bi, 0, sizeof bi);
        bi.struct_size = sizeof bi;
        wkv_status s = wkv_backend_get_info(all[k], &bi);
        const char* name = (s == WKV_OK && bi.name) ? bi.name : wkvt_backend_name(all[k]);
        if (s != WKV_OK) {
            const char* why = wkv_last_error(NULL);
            printf("  %-7s error: %s%s%s\n", name, wkv_status_string(s), why && *why ? ": " : "",
                   why ? why : "");
            continue;
        }
        if (!bi.available) {
            printf("  %-7s unavailable: %s\n", name, bi.reason ? bi.reason : "(no reason given)");
            continue;
        }
        printf("  %-7s available (%s), %d device%s\n", name, bi.reason ? bi.reason : "",
               bi.device_count, bi.device_count == 1 ? "" : "s");
        for (int32_t d = 0; d < bi.device_count && d < 64; d++) {
            wkv_device_info di;
            memset(&di, 0, sizeof di);
            di.struct_size = sizeof di;
            if (wkv_device_get_info(all[k], d, &di) != WKV_OK) {
                printf("      device %d: (no information: %s)\n", d, wkv_last_error(NULL));
                continue;
            }
            di.name[sizeof di.name - 1] = '\0';
            printf("      device %d: %s", d, di.name[0] ? di.name : "(unnamed)");
            print_memory(di.memory_bytes);
            if (di.compute_units > 0) printf(", %d compute units", di.compute_units);
            printf("\n");
        }
        printf("      ops:");
        int any = 0;
        const wkv_op ops[] = {WKV_OP_RWKV4, WKV_OP_RWKV6, WKV_OP_RWKV7};
        for (size_t o = 0; o < 3; o++)
            if (bi.ops & (1u << ops[o])) printf(" %s", wkvt_op_name(ops[o])), any = 1;
        if (!any) printf(" (none)");
        printf("\n      dtypes:");
        const char* dts[] = {"f32", "f16", "bf16"};
        any = 0;
        for (int b = 0; b < 3; b++)
            if (bi.dtypes & (1u << b)) printf(" %s", dts[b]), any = 1;
        if (!any) printf(" (none)");
        printf("\n      decay forms:");
        any = 0;
        for (int f = WKV_DECAY_DIRECT; f <= WKV_DECAY_CLAMPW; f++)
            if (bi.decay_forms & (1u << f)) printf(" %s", wkvt_decay_form_name((wkv_decay_form)f)), any = 1;
        if (!any) printf(" (none)");
        printf("\n      head sizes:");
        if (bi.any_head_size) printf(" any");
        else {
            int n = bi.num_head_sizes < WKV_MAX_HEAD_SIZES ? bi.num_head_sizes : WKV_MAX_HEAD_SIZES;
            for (int h = 0; h < n; h++) printf(" %d", bi.head_sizes[h]);
            if (n <= 0) printf(" (none)");
        }
        printf("\n");
    }
    wkv_context_options co;
    memset(&co, 0, sizeof co);
    co.struct_size = sizeof co;
    wkv_context* ctx = NULL;
    if (wkv_context_create(&co, &ctx) == WKV_OK) {
        printf("auto: a context with backend AUTO runs on %s\n",
               wkvt_backend_name(wkv_context_backend(ctx)));
        wkv_context_destroy(ctx);
    } else {
        printf("auto: no context could be created: %s\n", wkv_last_error(NULL));
    }
    return BENCH_OK;
}
