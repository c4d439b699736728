/* WKV_FAULT: parsing it into a plan and deciding, point by point, whether to fail (fault.h). */
#include "fault.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wkv_fault_compiled_in(void) {
#if defined(WKV_FAULT_INJECTION)
    return 1;
#else
    return 0;
#endif
}

#if defined(WKV_FAULT_INJECTION)

enum { MAX_SPECS = 8 };

typedef struct fault_spec {
    int32_t kind;
    char site[16]; /* "" = every site of the kind */
    int64_t nth;   /* 0 = every time */
    int64_t seen;  /* matching points reached so far */
} fault_spec;

struct wkv_fault_plan {
    int count;
    fault_spec spec[MAX_SPECS];
};

static const struct {
    const char* name;
    int32_t kind;
    const char* sites; /* space-separated, with a space at each end */
} k_kinds[] = {
    {"oom", WKV_FAULT_OOM, " context threads state scratch buffer "},
    {"device_lost", WKV_FAULT_DEVICE_LOST, " submit sync "},
    {"no_driver", WKV_FAULT_NO_DRIVER, " cuda vulkan "},
};

static int site_known(const char* sites, const char* site) {
    char key[24];
    snprintf(key, sizeof key, " %s ", site);
    return strstr(sites, key) != NULL;
}

/* One spec from [s, s + len). */
static int parse_spec(const char* s, size_t len, fault_spec* out, char* err, size_t err_size) {
    char buf[64];
    if (len == 0 || len >= sizeof buf) {
        snprintf(err, err_size, "'%.*s' is not kind[:site][@n]", (int)len, s);
        return 0;
    }
    memcpy(buf, s, len);
    buf[len] = '\0';
    memset(out, 0, sizeof *out);
    char* at = strchr(buf, '@');
    if (at) {
        *at = '\0';
        char* end = NULL;
        long long n = strtoll(at + 1, &end, 10);
        if (!at[1] || *end || n < 1) {
            snprintf(err, err_size, "'%.*s': the count after @ must be a whole number >= 1", (int)len, s);
            return 0;
        }
        out->nth = n;
    }
    char* colon = strchr(buf, ':');
    if (colon) *colon = '\0';
    size_t k = 0;
    while (k < sizeof k_kinds / sizeof k_kinds[0] && strcmp(k_kinds[k].name, buf) != 0) ++k;
    if (k == sizeof k_kinds / sizeof k_kinds[0]) {
        snprintf(err, err_size, "'%.*s': unknown kind '%s' (expected oom, device_lost or no_driver)",
                 (int)len, s, buf);
        return 0;
    }
    out->kind = k_kinds[k].kind;
    if (colon) {
        if (!site_known(k_kinds[k].sites, colon + 1) || strlen(colon + 1) >= sizeof out->site) {
            snprintf(err, err_size, "'%.*s': %s has no site '%s' (its sites:%s)", (int)len, s,
                     k_kinds[k].name, colon + 1, k_kinds[k].sites);
            return 0;
        }
        snprintf(out->site, sizeof out->site, "%s", colon + 1);
    }
    return 1;
}

static wkv_status parse(const char* env, wkv_fault_plan* plan, char* err, size_t err_size) {
    memset(plan, 0, sizeof *plan);
    const char* s = env;
    for (;;) {
        const char* comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (plan->count == MAX_SPECS) {
            snprintf(err, err_size, "more than %d specs", MAX_SPECS);
            return WKV_ERROR_INVALID_ARGUMENT;
        }
        if (!parse_spec(s, len, &plan->spec[plan->count], err, err_size)) return WKV_ERROR_INVALID_ARGUMENT;
        ++plan->count;
        if (!comma) return WKV_OK;
        s = comma + 1;
    }
}

wkv_status wkv_fault_plan_create(wkv_fault_plan** out, char* err, size_t err_size) {
    *out = NULL;
    const char* env = getenv("WKV_FAULT");
    if (!env || !*env) return WKV_OK;
    wkv_fault_plan plan;
    wkv_status st = parse(env, &plan, err, err_size);
    if (st) return st;
    wkv_fault_plan* p = (wkv_fault_plan*)malloc(sizeof *p);
    if (!p) {
        snprintf(err, err_size, "out of memory");
        return WKV_ERROR_OUT_OF_MEMORY;
    }
    *p = plan;
    *out = p;
    return WKV_OK;
}

void wkv_fault_plan_destroy(wkv_fault_plan* plan) { free(plan); }

int32_t wkv_fault_check(void* plan, int32_t kind, const char* site) {
    wkv_fault_plan* p = (wkv_fault_plan*)plan;
    if (!p) return 0;
    int32_t hit = 0;
    for (int i = 0; i < p->count; ++i) {
        fault_spec* f = &p->spec[i];
        if (f->kind != kind || (f->site[0] && strcmp(f->site, site) != 0)) continue;
        ++f->seen;
        if (f->nth == 0 || f->seen == f->nth) hit = 1;
    }
    return hit;
}

int wkv_fault_process_hit(int32_t kind, const char* site) {
    /* Called under the registry's lock (its only caller), so the lazy parse needs no lock. */
    static int parsed;
    static wkv_fault_plan plan;
    static int valid;
    if (!parsed) {
        parsed = 1;
        const char* env = getenv("WKV_FAULT");
        char err[256];
        valid = env && *env && parse(env, &plan, err, sizeof err) == WKV_OK; /* context creation reports errors */
    }
    return valid ? wkv_fault_check(&plan, kind, site) : 0;
}

#else /* !WKV_FAULT_INJECTION */

wkv_status wkv_fault_plan_create(wkv_fault_plan** out, char* err, size_t err_size) {
    (void)err;
    (void)err_size;
    *out = NULL;
    return WKV_OK;
}

void wkv_fault_plan_destroy(wkv_fault_plan* plan) { (void)plan; }

int32_t wkv_fault_check(void* plan, int32_t kind, const char* site) {
    (void)plan;
    (void)kind;
    (void)site;
    return 0;
}

int wkv_fault_process_hit(int32_t kind, const char* site) {
    (void)kind;
    (void)site;
    return 0;
}

#endif
