/* wkv-bench golden: every golden file through a backend, one line per file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "golden.h"
#include "wkv_tools.h"

static void golden_usage(FILE* f) {
    fprintf(f,
            "usage: wkv-bench golden [--backend auto|cpu|cuda|vulkan] [--dtype f32|f16|bf16|all]\n"
            "                        [--device I] [--threads K] [--key-major] [--reference]\n"
            "                        [--verbose] [--json] [FILE...]\n"
            "\n"
            "Runs each golden file's case through the public API — wkv_forward (state in and\n"
            "out), then wkv_backward (dy, d state_out, workspace, d state_in) — with every output\n"
            "poisoned with NaN first, and compares each output with the reference by the\n"
            "norm-wise relative error ||out - ref|| / ||ref||:\n"
            "  f32        reference: the file's float64 tensors;     tolerance %.0e\n"
            "  f16, bf16  inputs rounded to 16 bits; reference: libwkv's float64 reference on\n"
            "             the rounded inputs; tolerance %.0e on y and the state, %.0e on gradients\n"
            "Prints one line per file: PASS or FAIL, the worst error and its tensor.\n"
            "\n"
            "  --backend B   backend to run on (default auto)\n"
            "  --dtype D     input/output dtype; `all` runs f32, f16 and bf16 (default f32)\n"
            "  --device I    GPU ordinal (default 0)\n"
            "  --threads K   CPU threads (default: the library's)\n"
            "  --key-major   pass the states key-major (WKV_FLAG_STATE_KEY_MAJOR)\n"
            "  --reference   check libwkv's float64 reference against the files instead\n"
            "  --verbose     also print every tensor's error\n"
            "  --json        one JSON object per file and line instead: {\"kind\": \"golden\", \"file\",\n"
            "                \"op\", \"backend\", \"device\", \"dtype\", \"status\" (pass, fail, unsupported,\n"
            "                error), \"max_rel_err\", \"worst\", \"message\", \"tensors\": [{\"name\", \"err\",\n"
            "                \"tol\", \"pass\"}]}, then {\"kind\": \"golden_summary\", \"passed\", \"total\"}\n"
            "  FILE...       golden files; a bare name is also looked up in the golden\n"
            "                directory (default: every *.safetensors in $WKV_GOLDEN_DIR, else\n"
            "                %s)\n"
            "\n"
            "Exit status: 0 when every file passes, 1 otherwise, 2 on a usage error.\n",
            WKV_GOLDEN_TOL_F32, WKV_GOLDEN_TOL_16BIT_FORWARD, WKV_GOLDEN_TOL_16BIT_GRAD,
#ifdef WKV_DEFAULT_GOLDEN_DIR
            WKV_DEFAULT_GOLDEN_DIR
#else
            "tests/golden"
#endif
    );
}

static void json_number(double x) {
    if (x == x && x - x == 0.0) printf("%.6g", x);
    else printf("null"); /* NaN or infinite: not a JSON number */
}

static void golden_json(const char* file, const wkv_golden_result* r, int reference) {
    static const char* const status[] = {"pass", "fail", "unsupported", "error"};
    printf("{\"kind\":\"golden\",\"file\":");
    bench_json_string(stdout, file);
    printf(",\"op\":");
    bench_json_string(stdout, r->op_name);
    printf(",\"backend\":\"%s\",\"device\":", reference ? "reference" : wkvt_backend_name(r->backend));
    bench_json_string(stdout, r->device);
    printf(",\"dtype\":\"%s\",\"status\":\"%s\",\"max_rel_err\":", wkvt_dtype_name(r->dtype),
           r->status >= 0 && r->status <= 3 ? status[r->status] : "error");
    json_number(r->max_rel_err);
    printf(",\"worst\":");
    bench_json_string(stdout, r->worst);
    printf(",\"message\":");
    bench_json_string(stdout, r->message);
    printf(",\"tensors\":[");
    for (int t = 0; t < r->num_tensors; t++) {
        printf("%s{\"name\":", t ? "," : "");
        bench_json_string(stdout, r->tensors[t].name);
        printf(",\"err\":");
        json_number(r->tensors[t].err);
        printf(",\"tol\":%.6g,\"pass\":%s}", r->tensors[t].tol, r->tensors[t].pass ? "true" : "false");
    }
    printf("]}\n");
}

static const char* base_name(const char* path) {
    const char* s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int bench_golden(int argc, char** argv) {
    const char* cmd = "golden";
    wkv_golden_options o;
    memset(&o, 0, sizeof o);
    o.backend = WKV_BACKEND_AUTO;
    wkv_dtype dtypes[3] = {WKV_DTYPE_F32};
    int ndtypes = 1, reference = 0, verbose = 0, json = 0;
    char** files = (char**)calloc((size_t)argc + 1, sizeof *files);
    size_t nfiles = 0;
    if (!files) return BENCH_FAIL;
    int rc = BENCH_USAGE;
    char** resolved = NULL;
    for (int i = 1; i < argc; i++) {
        const char* v = NULL;
        int m;
        int64_t n;
        if (bench_is_help(argv[i])) {
            golden_usage(stdout);
            free(files);
            return BENCH_OK;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--backend", &v))) {
            if (m < 0) goto out;
            if (wkvt_backend_parse(v, &o.backend)) {
                bench_usage_error(cmd, "--backend: '%s' is not auto, cpu, cuda or vulkan", v);
                goto out;
            }
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--dtype", &v))) {
            if (m < 0) goto out;
            if (!strcmp(v, "all")) {
                dtypes[0] = WKV_DTYPE_F32;
                dtypes[1] = WKV_DTYPE_F16;
                dtypes[2] = WKV_DTYPE_BF16;
                ndtypes = 3;
            } else if (wkvt_dtype_parse(v, &dtypes[0])) {
                bench_usage_error(cmd, "--dtype: '%s' is not f32, f16, bf16 or all", v);
                goto out;
            } else {
                ndtypes = 1;
            }
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--device", &v))) {
            if (m < 0 || bench_int(cmd, "--device", v, 0, 1024, &n)) goto out;
            o.device_index = (int32_t)n;
        } else if ((m = bench_opt(argc, argv, &i, cmd, "--threads", &v))) {
            if (m < 0 || bench_int(cmd, "--threads", v, 0, 1024, &n)) goto out;
            o.cpu_threads = (int32_t)n;
        } else if (!strcmp(argv[i], "--key-major")) {
            o.state_key_major = 1;
        } else if (!strcmp(argv[i], "--reference")) {
            reference = 1;
        } else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v")) {
            verbose = 1;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            bench_usage_error(cmd, "unknown option '%s'", argv[i]);
            goto out;
        } else {
            files[nfiles++] = argv[i];
        }
    }
    /* A bare name that is not here: look for it in the golden directory. */
    resolved = (char**)calloc(nfiles + 1, sizeof *resolved);
    if (!resolved) goto out;
    for (size_t f = 0; f < nfiles; f++) {
        FILE* fp = fopen(files[f], "rb");
        if (fp) {
            fclose(fp);
            continue;
        }
        if (strchr(files[f], '/')) continue;
        size_t len = strlen(wkv_golden_dir()) + strlen(files[f]) + 2;
        if (!(resolved[f] = (char*)malloc(len))) continue;
        snprintf(resolved[f], len, "%s/%s", wkv_golden_dir(), files[f]);
        if ((fp = fopen(resolved[f], "rb"))) {
            fclose(fp);
            files[f] = resolved[f];
        }
    }

    char** listed = NULL;
    size_t nlisted = 0;
    if (nfiles == 0) {
        char err[512];
        const char* dir = wkv_golden_dir();
        if (wkv_golden_list(dir, &listed, &nlisted, err, sizeof err)) {
            bench_error("wkv-bench golden: %s\n", err);
            rc = BENCH_FAIL;
            goto out;
        }
        if (nlisted == 0) {
            bench_error("wkv-bench golden: no *.safetensors files in %s\n", dir);
            wkv_golden_list_free(listed, nlisted);
            rc = BENCH_FAIL;
            goto out;
        }
    }
    char** paths = nfiles ? files : listed;
    size_t npaths = nfiles ? nfiles : nlisted;
    size_t width = 0;
    for (size_t f = 0; f < npaths; f++)
        if (strlen(base_name(paths[f])) > width) width = strlen(base_name(paths[f]));

    int passed = 0, total = 0;
    for (int d = 0; d < (reference ? 1 : ndtypes); d++) {
        o.dtype = dtypes[d];
        for (size_t f = 0; f < npaths; f++) {
            wkv_golden_result r;
            bench_progress(total + 1, (reference ? 1 : ndtypes) * (int)npaths, "%s %s",
                           base_name(paths[f]), reference ? "float64 reference" : wkvt_dtype_name(o.dtype));
            if (reference) wkv_golden_run_reference(paths[f], &r);
            else wkv_golden_run_ex(paths[f], &o, &r);
            bench_progress_clear();
            total++;
            passed += r.status == WKV_GOLDEN_PASS;
            if (json) {
                golden_json(base_name(paths[f]), &r, reference);
                fflush(stdout);
                continue;
            }
            char line[1024];
            wkv_golden_format(&r, line, sizeof line);
            if (reference) { /* "cpu f32" would be misleading */
                if (r.status == WKV_GOLDEN_PASS)
                    snprintf(line, sizeof line, "PASS  max_rel_err=%.1e (%s)  float64 reference",
                             r.max_rel_err, r.worst);
                else if (r.status == WKV_GOLDEN_ERROR)
                    snprintf(line, sizeof line, "FAIL error: %s", r.message);
                else if (r.status == WKV_GOLDEN_UNSUPPORTED)
                    snprintf(line, sizeof line, "FAIL %s", r.message);
                else
                    snprintf(line, sizeof line, "FAIL  max_rel_err=%.1e (%s)  float64 reference  %s",
                             r.max_rel_err, r.worst, r.message);
            }
            printf("%-*s  %s\n", (int)width, base_name(paths[f]), line);
            if (verbose)
                for (int t = 0; t < r.num_tensors; t++)
                    printf("%*s    %-8s %.3e  (tol %.0e)%s\n", (int)width, "", r.tensors[t].name,
                           r.tensors[t].err, r.tensors[t].tol, r.tensors[t].pass ? "" : "  FAIL");
            fflush(stdout);
        }
    }
    if (json) printf("{\"kind\":\"golden_summary\",\"passed\":%d,\"total\":%d}\n", passed, total);
    else printf("%d of %d passed\n", passed, total);
    wkv_golden_list_free(listed, nlisted);
    rc = passed == total ? BENCH_OK : BENCH_FAIL;
out:
    if (resolved)
        for (size_t f = 0; f < nfiles; f++) free(resolved[f]);
    free(resolved);
    free(files);
    return rc;
}
