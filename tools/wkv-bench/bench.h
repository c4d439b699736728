/* wkv-bench: the subcommands and the small command-line helpers they share. */
#ifndef WKV_BENCH_BENCH_H
#define WKV_BENCH_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "wkv/wkv.h"

/* Exit codes of every subcommand. */
enum { BENCH_OK = 0, BENCH_FAIL = 1, BENCH_USAGE = 2 };

/* Each gets argv[0] = the subcommand's name and returns an exit code. */
int bench_info(int argc, char** argv);
int bench_golden(int argc, char** argv);
int bench_perf(int argc, char** argv);
int bench_perf_attention(int argc, char** argv); /* perf --op attention */
int bench_demo(int argc, char** argv);

/* 1 for -h / --help. */
int bench_is_help(const char* arg);

/* Matches argv[*i] against option `name` ("--backend") in both spellings, "--backend cpu" and
 * "--backend=cpu". Returns 1 with *value set (advancing *i past a separate value), 0 when
 * argv[*i] is another option, and -1 (message printed) when the value is missing. */
int bench_opt(int argc, char** argv, int* i, const char* cmd, const char* name,
              const char** value);

/* Prints "wkv-bench CMD: <message>" and a hint to stderr; returns BENCH_USAGE. */
int bench_usage_error(const char* cmd, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Parses an integer in [lo, hi] for option `name`; on error prints it and returns -1. */
int bench_int(const char* cmd, const char* name, const char* s, int64_t lo, int64_t hi,
              int64_t* out);

/* Parses a comma-separated list of integers in [lo, hi] (at most max entries). Returns the
 * count, or -1 after printing the error. */
int bench_int_list(const char* cmd, const char* name, const char* s, int64_t lo, int64_t hi,
                   int64_t* out, int max);

/* Name of the first device of backend b, or "" (into buf). */
void bench_device_name(wkv_backend b, int32_t index, char* buf, size_t len);

/* The number of CPU threads a context created with cpu_threads = requested will use. */
int bench_cpu_threads(int requested);

/* Progress of long work on stderr ("[3/12] what"), shown only when stderr is a terminal and
 * WKV_BENCH_PROGRESS is not 0: logs, pipes and CI output never see it. bench_progress_clear()
 * erases the line; call it before printing a result. */
void bench_progress(int done, int total, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void bench_progress_clear(void);

/* fprintf(stderr, ...) that first erases a progress line. */
void bench_error(const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* On a GPU backend the timed tensors live in library buffers (wkv_buffer_*), so that a call
 * measures the kernels, not the staging of host memory: bench_make_resident moves a contiguous
 * host tensor (if present) into a new buffer of ctx (0, or -1 after printing an error naming
 * `name`), bench_release destroys every buffer made. */
enum { BENCH_MAX_BUFFERS = 24 };
typedef struct bench_resident {
    wkv_buffer* buf[BENCH_MAX_BUFFERS];
    int n;
} bench_resident;
int bench_make_resident(wkv_context* ctx, bench_resident* r, wkv_tensor* t, const char* name);
void bench_release(bench_resident* r);

/* Prints s as a JSON string literal (with quotes). */
void bench_json_string(FILE* f, const char* s);

#endif /* WKV_BENCH_BENCH_H */
