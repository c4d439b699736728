/* wkv-bench: does libwkv work on this machine, and how fast? One binary, four subcommands. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "wkv_tools.h"

static void usage(FILE* f) {
    fprintf(f,
            "usage: wkv-bench <command> [options]\n"
            "\n"
            "commands:\n"
            "  demo     run a realistic RWKV-7 workload (prefill + token-by-token decoding over\n"
            "           several layers) on the best backend present, check it against the\n"
            "           float64 reference and report speed             (start here)\n"
            "  info     version, build, backends, devices, and what each supports\n"
            "  golden   check backends against the golden test vectors\n"
            "  perf     time wkv_forward / wkv_backward for given shapes (text or JSON lines)\n"
            "\n"
            "`wkv-bench <command> --help` describes each command's options.\n"
            "Environment: WKV_BACKEND=cpu|cuda|vulkan overrides the automatic backend choice,\n"
            "WKV_NUM_THREADS sets the CPU threads, WKV_GOLDEN_DIR the golden directory.\n");
}

int main(int argc, char** argv) {
    if (argc < 2) {
        usage(stderr);
        return BENCH_USAGE;
    }
    const char* cmd = argv[1];
    if (bench_is_help(cmd) || !strcmp(cmd, "help")) {
        usage(stdout);
        return BENCH_OK;
    }
    if (!strcmp(cmd, "--version")) {
        printf("wkv-bench, libwkv %s\n", wkv_version_string());
        return BENCH_OK;
    }
    if (!strcmp(cmd, "info")) return bench_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "golden")) return bench_golden(argc - 1, argv + 1);
    if (!strcmp(cmd, "perf")) return bench_perf(argc - 1, argv + 1);
    if (!strcmp(cmd, "demo")) return bench_demo(argc - 1, argv + 1);
    fprintf(stderr, "wkv-bench: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return BENCH_USAGE;
}

/* ------------------------------------------------------------------ shared helpers */

int bench_is_help(const char* arg) { return !strcmp(arg, "-h") || !strcmp(arg, "--help"); }

int bench_usage_error(const char* cmd, const char* fmt, ...) {
    va_list ap;
    fprintf(stderr, "wkv-bench %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see: wkv-bench %s --help)\n", cmd);
    return BENCH_USAGE;
}

int bench_opt(int argc, char** argv, int* i, const char* cmd, const char* name,
              const char** value) {
    const char* a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *value = a + n + 1;
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        bench_usage_error(cmd, "option %s needs a value", name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

int bench_int(const char* cmd, const char* name, const char* s, int64_t lo, int64_t hi,
              int64_t* out) {
    if (wkvt_parse_i64(s, lo, hi, out)) {
        bench_usage_error(cmd, "%s: '%s' is not an integer in [%lld, %lld]", name, s,
                          (long long)lo, (long long)hi);
        return -1;
    }
    return 0;
}

int bench_int_list(const char* cmd, const char* name, const char* s, int64_t lo, int64_t hi,
                   int64_t* out, int max) {
    char buf[256];
    if (strlen(s) >= sizeof buf) {
        bench_usage_error(cmd, "%s: list too long", name);
        return -1;
    }
    strcpy(buf, s);
    int n = 0;
    char* save = NULL;
    for (char* tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n >= max) {
            bench_usage_error(cmd, "%s: at most %d values", name, max);
            return -1;
        }
        if (bench_int(cmd, name, tok, lo, hi, &out[n])) return -1;
        n++;
    }
    if (n == 0) {
        bench_usage_error(cmd, "%s: no value", name);
        return -1;
    }
    return n;
}

void bench_device_name(wkv_backend b, int32_t index, char* buf, size_t len) {
    wkv_device_info di;
    memset(&di, 0, sizeof di);
    di.struct_size = sizeof di;
    buf[0] = '\0';
    if (wkv_device_get_info(b, index, &di) == WKV_OK) {
        di.name[sizeof di.name - 1] = '\0';
        snprintf(buf, len, "%s", di.name);
    }
}

int bench_cpu_threads(int requested) {
    if (requested > 0) return requested;
    const char* e = getenv("WKV_NUM_THREADS");
    int64_t v;
    if (e && !wkvt_parse_i64(e, 1, 4096, &v)) return (int)v;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static int g_progress_shown; /* a progress line is on the terminal now */

static int progress_wanted(void) {
    static int wanted = -1;
    if (wanted < 0) {
        const char* e = getenv("WKV_BENCH_PROGRESS");
        wanted = isatty(STDERR_FILENO) && !(e && !strcmp(e, "0"));
    }
    return wanted;
}

void bench_progress(int done, int total, const char* fmt, ...) {
    if (!progress_wanted()) return;
    va_list ap;
    fflush(stdout); /* results first, then the progress line below them */
    fprintf(stderr, "\r\033[K[%d/%d] ", done, total);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
    g_progress_shown = 1;
}

void bench_progress_clear(void) {
    if (!g_progress_shown) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    g_progress_shown = 0;
}

void bench_error(const char* fmt, ...) {
    va_list ap;
    bench_progress_clear();
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

void bench_json_string(FILE* f, const char* s) {
    fputc('"', f);
    for (const unsigned char* p = (const unsigned char*)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}
