/* wkv-bench info: version, build, and for each backend whether it is usable and what it
 * supports. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "golden.h"
#include "wkv_tools.h"

static void info_usage(FILE* f) {
    fprintf(f,
            "usage: wkv-bench info [--json]\n"
            "\n"
            "Prints the libwkv version and build, then for each backend (cpu, cuda, vulkan):\n"
            "whether it is available (or why not), its devices (name, memory, compute units),\n"
            "the ops, dtypes, decay forms and head sizes it supports and its attention kernel\n"
            "configurations; last, the backend an AUTO context picks here and where `golden`\n"
            "finds the golden files ($WKV_GOLDEN_DIR, else the installed share/wkv/golden, else\n"
            "the source tree's tests/golden).\n"
            "  --json   the same as one JSON object (the schema python -m wkv info --json prints):\n"
            "           {\"kind\": \"info\", \"libwkv\", \"version_code\", \"build\", \"backends\": [{\"backend\",\n"
            "           \"available\", \"reason\", \"devices\": [{\"device\", \"memory_bytes\", \"compute_units\"}],\n"
            "           \"ops\", \"dtypes\", \"decay_forms\", \"head_sizes\" (\"any\" or a list),\n"
            "           \"attention_configs\": [names]}], \"auto\", \"golden_dir\"}\n");
}

static void print_memory(uint64_t bytes) {
    if (!bytes) return;
    double gib = (double)bytes / (1024.0 * 1024.0 * 1024.0);
    if (gib >= 1.0) printf(", %.1f GiB", gib);
    else printf(", %.0f MiB", (double)bytes / (1024.0 * 1024.0));
}

/* The names of the attention configurations of a context on backend b (0 when none). */
static int32_t attention_names(wkv_backend b, wkv_attention_config* out, int32_t cap) {
    wkv_context_options co;
    memset(&co, 0, sizeof co);
    co.struct_size = sizeof co;
    co.backend = b;
    wkv_context* ctx = NULL;
    if (wkv_context_create(&co, &ctx) != WKV_OK) return 0;
    for (int32_t i = 0; i < cap; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].struct_size = sizeof out[i];
    }
    int32_t n = 0;
    if (wkv_attention_configs(ctx, out, cap, &n) != WKV_OK) n = 0;
    wkv_context_destroy(ctx);
    return n < cap ? n : cap;
}

enum { INFO_MAX_CONFIGS = 32 };

static void json_list_bits(const char* key, uint32_t mask, const char* const* names, const int* bits, int n) {
    printf(",\"%s\":[", key);
    int first = 1;
    for (int i = 0; i < n; i++)
        if (mask & (1u << bits[i])) printf("%s\"%s\"", first ? "" : ",", names[i]), first = 0;
    printf("]");
}

static int info_json(void) {
    uint32_t v = wkv_version();
    printf("{\"kind\":\"info\",\"libwkv\":");
    bench_json_string(stdout, wkv_version_string());
    printf(",\"version_code\":%u,\"build\":", v);
    bench_json_string(stdout, wkv_build_info());
    printf(",\"backends\":[");
    const wkv_backend all[] = {WKV_BACKEND_CPU, WKV_BACKEND_CUDA, WKV_BACKEND_VULKAN};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        wkv_backend_info bi;
        memset(&bi, 0, sizeof bi);
        bi.struct_size = sizeof bi;
        const wkv_status s = wkv_backend_get_info(all[k], &bi);
        printf("%s{\"backend\":\"%s\",\"available\":%s,\"reason\":", k ? "," : "", wkvt_backend_name(all[k]),
               s == WKV_OK && bi.available ? "true" : "false");
        bench_json_string(stdout, s != WKV_OK ? wkv_last_error(NULL) : bi.reason ? bi.reason : "");
        printf(",\"devices\":[");
        for (int32_t d = 0; s == WKV_OK && bi.available && d < bi.device_count && d < 64; d++) {
            wkv_device_info di;
            memset(&di, 0, sizeof di);
            di.struct_size = sizeof di;
            if (wkv_device_get_info(all[k], d, &di) != WKV_OK) continue;
            di.name[sizeof di.name - 1] = '\0';
            printf("%s{\"device\":", d ? "," : "");
            bench_json_string(stdout, di.name);
            printf(",\"memory_bytes\":%llu,\"compute_units\":%d}", (unsigned long long)di.memory_bytes,
                   di.compute_units);
        }
        printf("]");
        const char* ops[] = {"rwkv4", "rwkv6", "rwkv7"};
        const int op_bits[] = {WKV_OP_RWKV4, WKV_OP_RWKV6, WKV_OP_RWKV7};
        const char* dts[] = {"f32", "f16", "bf16"};
        const int dt_bits[] = {0, 1, 2};
        const char* forms[] = {"direct", "log", "exp_neg_exp", "clampw"};
        const int form_bits[] = {WKV_DECAY_DIRECT, WKV_DECAY_LOG, WKV_DECAY_EXP_NEG_EXP, WKV_DECAY_CLAMPW};
        const int ok = s == WKV_OK && bi.available;
        json_list_bits("ops", ok ? bi.ops : 0, ops, op_bits, 3);
        json_list_bits("dtypes", ok ? bi.dtypes : 0, dts, dt_bits, 3);
        json_list_bits("decay_forms", ok ? bi.decay_forms : 0, forms, form_bits, 4);
        if (ok && bi.any_head_size) {
            printf(",\"head_sizes\":\"any\"");
        } else {
            printf(",\"head_sizes\":[");
            const int n = ok ? (bi.num_head_sizes < WKV_MAX_HEAD_SIZES ? bi.num_head_sizes : WKV_MAX_HEAD_SIZES) : 0;
            for (int h = 0; h < n; h++) printf("%s%d", h ? "," : "", bi.head_sizes[h]);
            printf("]");
        }
        wkv_attention_config cfg[INFO_MAX_CONFIGS];
        const int32_t nc = ok ? attention_names(all[k], cfg, INFO_MAX_CONFIGS) : 0;
        printf(",\"attention_configs\":[");
        for (int32_t i = 0; i < nc; i++) {
            cfg[i].name[sizeof cfg[i].name - 1] = '\0';
            printf("%s", i ? "," : "");
            bench_json_string(stdout, cfg[i].name);
        }
        printf("]}");
    }
    wkv_context_options co;
    memset(&co, 0, sizeof co);
    co.struct_size = sizeof co;
    wkv_context* ctx = NULL;
    printf("],\"auto\":");
    if (wkv_context_create(&co, &ctx) == WKV_OK) {
        printf("\"%s\"", wkvt_backend_name(wkv_context_backend(ctx)));
        wkv_context_destroy(ctx);
    } else {
        printf("null");
    }
    printf(",\"golden_dir\":");
    bench_json_string(stdout, wkv_golden_dir());
    printf("}\n");
    return BENCH_OK;
}

int bench_info(int argc, char** argv) {
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (bench_is_help(argv[i])) {
            info_usage(stdout);
            return BENCH_OK;
        }
        if (!strcmp(argv[i], "--json")) {
            json = 1;
            continue;
        }
        return bench_usage_error("info", "unknown argument '%s'", argv[i]);
    }
    if (json) return info_json();
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
        wkv_attention_config cfg[INFO_MAX_CONFIGS];
        const int32_t nc = attention_names(all[k], cfg, INFO_MAX_CONFIGS);
        printf("\n      attention:");
        for (int32_t i = 0; i < nc; i++) {
            cfg[i].name[sizeof cfg[i].name - 1] = '\0';
            printf(" %s%s", cfg[i].name, cfg[i].is_default ? " (default)" : "");
        }
        if (nc == 0) printf(" (no kernel)");
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
    printf("golden files: %s\n", wkv_golden_dir());
    return BENCH_OK;
}
