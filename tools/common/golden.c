/* The golden-file checker: see golden.h. */
#define _POSIX_C_SOURCE 200809L
#include "golden.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "reference/wkv_reference.h"
#include "safetensors.h"
#include "wkv_tools.h"

/* ============================================================================ the op table */

enum { G_MAX_IN = 8, G_MAX_PARTS = 3, G_GUARD = 256 };

typedef enum g_layout {
    G_BTHN, /* per-token [B,T,H,N]; state [B,H,N,N] */
    G_BTC   /* per-token [B,T,C];   state parts [B,C], library state [B,parts,C] */
} g_layout;

typedef enum g_shape {
    G_TOKEN,  /* [B,T,H,N] or [B,T,C] */
    G_HEAD,   /* [H,N] */
    G_CHANNEL /* [C] */
} g_shape;

typedef struct g_input {
    const char* name;      /* tensor name in the file, e.g. "r" */
    g_shape shape;
    size_t fwd_field;      /* offsetof(wkv_forward_desc, <tensor>) */
    size_t grad_field;     /* offsetof(wkv_backward_desc, <gradient>) */
    const char* grad_name; /* gradient tensor name in the file, e.g. "dr" */
} g_input;

/* What a float64 reference gets and fills: every array contiguous; the states (s0, sT, dsT,
 * ds0) in the library's layout (parts planar: [B, parts, ...]). */
typedef struct g_ref_io {
    int64_t B, T, H, N;
    wkv_decay_form form;
    const double* in[G_MAX_IN]; /* the op's inputs in table order */
    const double* s0;
    const double* dy;
    const double* dsT;
    double* y;
    double* sT;
    double* grad[G_MAX_IN];
    double* ds0;
} g_ref_io;

typedef struct g_op {
    const char* name; /* the files' "op" */
    wkv_op op;
    g_layout layout;
    int num_inputs;
    g_input inputs[G_MAX_IN];
    int num_parts;                  /* state parts */
    const char* parts[G_MAX_PARTS]; /* suffixes: s0<sfx>, sT<sfx>, dsT<sfx>, ds0<sfx> */
    void (*ref)(const g_ref_io* io); /* libwkv's float64 reference; NULL: none yet */
    const char* no_ref;              /* why there is none */
} g_op;

static void g_ref_rwkv7(const g_ref_io* io) {
    wkv_ref_rwkv7 in;
    memset(&in, 0, sizeof in);
    in.B = io->B;
    in.T = io->T;
    in.H = io->H;
    in.N = io->N;
    in.decay_form = io->form;
    in.r = io->in[0];
    in.w = io->in[1];
    in.k = io->in[2];
    in.v = io->in[3];
    in.a = io->in[4];
    in.b = io->in[5];
    in.s0 = io->s0;
    wkv_ref_rwkv7_forward(&in, io->y, io->sT);
    wkv_ref_rwkv7_backward(&in, io->dy, io->dsT, io->grad[0], io->grad[1], io->grad[2],
                           io->grad[3], io->grad[4], io->grad[5], io->ds0);
}

static void g_ref_rwkv6(const g_ref_io* io) {
    wkv_ref_rwkv6 in;
    memset(&in, 0, sizeof in);
    in.B = io->B;
    in.T = io->T;
    in.H = io->H;
    in.N = io->N;
    in.decay_form = io->form;
    in.r = io->in[0];
    in.w = io->in[1];
    in.k = io->in[2];
    in.v = io->in[3];
    in.u = io->in[4];
    in.s0 = io->s0;
    wkv_ref_rwkv6_forward(&in, io->y, io->sT);
    wkv_ref_rwkv6_backward(&in, io->dy, io->dsT, io->grad[0], io->grad[1], io->grad[2],
                           io->grad[3], io->grad[4], io->ds0);
}

/* RWKV-4: H = 1, N = C; the inputs in table order w, u, k, v; states [B,3,C] planar. */
static void g_ref_rwkv4(const g_ref_io* io) {
    wkv_ref_rwkv4 in;
    memset(&in, 0, sizeof in);
    in.B = io->B;
    in.T = io->T;
    in.C = io->N;
    in.w = io->in[0];
    in.u = io->in[1];
    in.k = io->in[2];
    in.v = io->in[3];
    in.s0 = io->s0;
    wkv_ref_rwkv4_forward(&in, io->y, io->sT);
    wkv_ref_rwkv4_backward(&in, io->dy, io->dsT, io->grad[0], io->grad[1], io->grad[2],
                           io->grad[3], io->ds0);
}

#define G_IN(nm, shp, fld, gnm)                                                            \
    { nm, shp, offsetof(wkv_forward_desc, fld), offsetof(wkv_backward_desc, gnm), #gnm }

/* Adding an op is an entry here (and, for 16-bit checks, a float64 reference adapter). */
static const g_op g_ops[] = {
    {"wkv7", WKV_OP_RWKV7, G_BTHN, 6,
     {G_IN("r", G_TOKEN, r, dr), G_IN("w", G_TOKEN, w, dw), G_IN("k", G_TOKEN, k, dk),
      G_IN("v", G_TOKEN, v, dv), G_IN("a", G_TOKEN, a, da), G_IN("b", G_TOKEN, b, db)},
     1, {""}, g_ref_rwkv7, NULL},
    {"wkv6", WKV_OP_RWKV6, G_BTHN, 5,
     {G_IN("r", G_TOKEN, r, dr), G_IN("w", G_TOKEN, w, dw), G_IN("k", G_TOKEN, k, dk),
      G_IN("v", G_TOKEN, v, dv), G_IN("u", G_HEAD, u, du)},
     1, {""}, g_ref_rwkv6, NULL},
    {"wkv4", WKV_OP_RWKV4, G_BTC, 4,
     {G_IN("w", G_CHANNEL, w, dw), G_IN("u", G_CHANNEL, u, du), G_IN("k", G_TOKEN, k, dk),
      G_IN("v", G_TOKEN, v, dv)},
     3, {"_aa", "_bb", "_pp"}, g_ref_rwkv4, NULL},
};

#undef G_IN

static const g_op* g_find_op(const char* name) {
    for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++)
        if (!strcmp(g_ops[i].name, name)) return &g_ops[i];
    return NULL;
}

/* ============================================================================== a case */

typedef struct g_case {
    const g_op* op;
    wkv_decay_form form;
    int64_t B, T, H, N; /* G_BTC: H = 1, N = C */

    int tok_ndim;
    int64_t tok_shape[4];
    size_t tok_n;
    int in_ndim[G_MAX_IN];
    int64_t in_shape[G_MAX_IN][4];
    size_t in_n[G_MAX_IN];
    int part_ndim; /* one state part as the file stores it */
    int64_t part_shape[4];
    size_t part_n;
    int st_ndim; /* the library's state */
    int64_t st_shape[4];
    size_t st_n;

    /* float32 data fed to the library (rounded to 16 bits for a 16-bit run) */
    float* in[G_MAX_IN];
    float* s0;  /* library layout */
    float* dy;
    float* dsT; /* library layout */
    /* the reference (library layout for the states) */
    double* ref_y;
    double* ref_sT;
    double* ref_grad[G_MAX_IN];
    double* ref_ds0;
} g_case;

static void g_case_free(g_case* c) {
    for (int i = 0; i < G_MAX_IN; i++) {
        free(c->in[i]);
        free(c->ref_grad[i]);
    }
    free(c->s0);
    free(c->dy);
    free(c->dsT);
    free(c->ref_y);
    free(c->ref_sT);
    free(c->ref_ds0);
    memset(c, 0, sizeof *c);
}

static void g_msg(wkv_golden_result* r, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof r->message, fmt, ap);
    va_end(ap);
}

static int g_mul(size_t a, size_t b, size_t* out) {
    if (a != 0 && b > ((size_t)1 << 48) / a) return -1; /* far above any golden case */
    *out = a * b;
    return 0;
}

static size_t g_numel(int ndim, const int64_t* shape) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    return n;
}

static void g_shape_str(int ndim, const int64_t* shape, char* buf, size_t len) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* Finds tensor `name`, checks it is a float tensor of exactly `shape`. */
static const st_tensor* g_tensor(const st_file* f, const char* name, int ndim,
                                 const int64_t* shape, wkv_golden_result* r) {
    const st_tensor* t = st_find(f, name);
    if (!t) {
        g_msg(r, "missing tensor \"%s\"", name);
        return NULL;
    }
    if (!st_dtype_is_float(t->dtype)) {
        g_msg(r, "tensor \"%s\" has dtype %s, expected a float dtype", name,
              st_dtype_name(t->dtype));
        return NULL;
    }
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char a[96], b[96];
        g_shape_str(t->ndim, t->shape, a, sizeof a);
        g_shape_str(ndim, shape, b, sizeof b);
        g_msg(r, "tensor \"%s\" has shape %s, expected %s", name, a, b);
        return NULL;
    }
    return t;
}

static float* g_load_f32(const st_file* f, const char* name, int ndim, const int64_t* shape,
                         wkv_golden_result* r) {
    const st_tensor* t = g_tensor(f, name, ndim, shape, r);
    if (!t) return NULL;
    float* p = (float*)malloc(t->numel ? (size_t)t->numel * sizeof *p : 1);
    if (!p) {
        g_msg(r, "out of memory loading \"%s\"", name);
        return NULL;
    }
    st_tensor_to_f32(t, p);
    return p;
}

static double* g_load_f64(const st_file* f, const char* name, int ndim, const int64_t* shape,
                          wkv_golden_result* r) {
    const st_tensor* t = g_tensor(f, name, ndim, shape, r);
    if (!t) return NULL;
    double* p = (double*)malloc(t->numel ? (size_t)t->numel * sizeof *p : 1);
    if (!p) {
        g_msg(r, "out of memory loading \"%s\"", name);
        return NULL;
    }
    st_tensor_to_f64(t, p);
    return p;
}

/* Parts [B, rest] each <-> library state [B, P, rest] (P = 1: the same layout). */
static void g_pack(const void* part, void* packed, int p, int P, size_t B, size_t rest,
                   size_t esize) {
    for (size_t b = 0; b < B; b++)
        memcpy((char*)packed + ((b * (size_t)P + (size_t)p) * rest) * esize,
               (const char*)part + b * rest * esize, rest * esize);
}

static void g_unpack(const void* packed, void* part, int p, int P, size_t B, size_t rest,
                     size_t esize) {
    for (size_t b = 0; b < B; b++)
        memcpy((char*)part + b * rest * esize,
               (const char*)packed + ((b * (size_t)P + (size_t)p) * rest) * esize, rest * esize);
}

/* Loads the state parts "<prefix><suffix>" into one library-layout array. */
static void* g_load_state(const st_file* f, const g_case* c, const char* prefix, int f64,
                          wkv_golden_result* r) {
    size_t esize = f64 ? sizeof(double) : sizeof(float);
    void* packed = malloc(c->st_n * esize);
    if (!packed) {
        g_msg(r, "out of memory");
        return NULL;
    }
    size_t B = (size_t)c->B, rest = c->part_n / (size_t)c->B;
    for (int p = 0; p < c->op->num_parts; p++) {
        char name[32];
        snprintf(name, sizeof name, "%s%s", prefix, c->op->parts[p]);
        void* part = f64 ? (void*)g_load_f64(f, name, c->part_ndim, c->part_shape, r)
                         : (void*)g_load_f32(f, name, c->part_ndim, c->part_shape, r);
        if (!part) {
            free(packed);
            return NULL;
        }
        g_pack(part, packed, p, c->op->num_parts, B, rest, esize);
        free(part);
    }
    return packed;
}

static int g_dim(const st_file* f, const char* key, int64_t* out, wkv_golden_result* r) {
    const char* s = st_meta(f, key);
    if (!s) {
        g_msg(r, "metadata has no \"%s\"", key);
        return -1;
    }
    if (wkvt_parse_i64(s, 1, (int64_t)1 << 24, out)) {
        g_msg(r, "metadata \"%s\" = \"%.40s\" is not an integer in [1, 2^24]", key, s);
        return -1;
    }
    return 0;
}

/* Opens `path` and reads the case: dims, inputs (float32), and with file_refs the file's float64
 * outputs and gradients. Returns WKV_GOLDEN_PASS on success (r->status untouched), else the
 * status to report with r->message set. */
static wkv_golden_status g_load(const char* path, g_case* c, int file_refs,
                                wkv_golden_result* r) {
    char err[400];
    memset(c, 0, sizeof *c);
    st_file* f = st_open(path, err, sizeof err);
    if (!f) {
        g_msg(r, "%s", err);
        return WKV_GOLDEN_ERROR;
    }
    wkv_golden_status st = WKV_GOLDEN_ERROR;
    const char* opname = st_meta(f, "op");
    if (!opname) {
        g_msg(r, "metadata has no \"op\" (not a libwkv golden file?)");
        goto done;
    }
    snprintf(r->op_name, sizeof r->op_name, "%s", opname);
    c->op = g_find_op(opname);
    if (!c->op) {
        g_msg(r, "unknown op \"%.32s\" (this checker knows wkv7, wkv6, wkv4)", opname);
        goto done;
    }
    const char* form = st_meta(f, "decay_form");
    if (!form || wkvt_decay_form_parse(form, &c->form)) {
        g_msg(r, "metadata \"decay_form\" is %s%.32s%s", form ? "\"" : "missing",
              form ? form : "", form ? "\", not one of direct, log, exp_neg_exp, clampw" : "");
        goto done;
    }
    r->op = c->op->op;
    r->decay_form = c->form;
    r->per_channel = c->op->layout == G_BTC;
    if (g_dim(f, "B", &c->B, r) || g_dim(f, "T", &c->T, r)) goto done;
    if (c->op->layout == G_BTHN) {
        if (g_dim(f, "H", &c->H, r) || g_dim(f, "N", &c->N, r)) goto done;
    } else {
        c->H = 1;
        if (g_dim(f, "C", &c->N, r)) goto done;
    }
    r->B = c->B;
    r->T = c->T;
    r->H = c->H;
    r->N = c->N;

    /* shapes, overflow-checked (each tensor must then exist in the file at that size, which
     * bounds every allocation below by the file size) */
    size_t n1, n2;
    if (g_mul((size_t)c->B, (size_t)c->T, &n1) || g_mul(n1, (size_t)c->H, &n2) ||
        g_mul(n2, (size_t)c->N, &c->tok_n) || g_mul((size_t)c->B, (size_t)c->H, &n1) ||
        g_mul(n1, (size_t)c->N, &n2) || g_mul(n2, (size_t)c->N, &n1)) {
        g_msg(r, "shape too large");
        goto done;
    }
    if (c->op->layout == G_BTHN) {
        c->tok_ndim = 4;
        c->tok_shape[0] = c->B, c->tok_shape[1] = c->T, c->tok_shape[2] = c->H;
        c->tok_shape[3] = c->N;
        c->part_ndim = 4;
        c->part_shape[0] = c->B, c->part_shape[1] = c->H, c->part_shape[2] = c->N;
        c->part_shape[3] = c->N;
        c->st_ndim = 4;
        memcpy(c->st_shape, c->part_shape, sizeof c->st_shape);
    } else {
        c->tok_ndim = 3;
        c->tok_shape[0] = c->B, c->tok_shape[1] = c->T, c->tok_shape[2] = c->N;
        c->part_ndim = 2;
        c->part_shape[0] = c->B, c->part_shape[1] = c->N;
        c->st_ndim = 3;
        c->st_shape[0] = c->B, c->st_shape[1] = c->op->num_parts, c->st_shape[2] = c->N;
    }
    c->part_n = g_numel(c->part_ndim, c->part_shape);
    c->st_n = g_numel(c->st_ndim, c->st_shape);
    for (int i = 0; i < c->op->num_inputs; i++) {
        switch (c->op->inputs[i].shape) {
        case G_TOKEN:
            c->in_ndim[i] = c->tok_ndim;
            memcpy(c->in_shape[i], c->tok_shape, sizeof c->tok_shape);
            break;
        case G_HEAD:
            c->in_ndim[i] = 2;
            c->in_shape[i][0] = c->H;
            c->in_shape[i][1] = c->N;
            break;
        case G_CHANNEL:
            c->in_ndim[i] = 1;
            c->in_shape[i][0] = c->N;
            break;
        }
        c->in_n[i] = g_numel(c->in_ndim[i], c->in_shape[i]);
    }

    for (int i = 0; i < c->op->num_inputs; i++) {
        const g_input* in = &c->op->inputs[i];
        if (!(c->in[i] = g_load_f32(f, in->name, c->in_ndim[i], c->in_shape[i], r))) goto done;
        if (file_refs &&
            !(c->ref_grad[i] = g_load_f64(f, in->grad_name, c->in_ndim[i], c->in_shape[i], r)))
            goto done;
    }
    if (!(c->dy = g_load_f32(f, "dy", c->tok_ndim, c->tok_shape, r))) goto done;
    if (!(c->s0 = (float*)g_load_state(f, c, "s0", 0, r))) goto done;
    if (!(c->dsT = (float*)g_load_state(f, c, "dsT", 0, r))) goto done;
    if (file_refs) {
        if (!(c->ref_y = g_load_f64(f, "y", c->tok_ndim, c->tok_shape, r))) goto done;
        if (!(c->ref_sT = (double*)g_load_state(f, c, "sT", 1, r))) goto done;
        if (!(c->ref_ds0 = (double*)g_load_state(f, c, "ds0", 1, r))) goto done;
    }
    st = WKV_GOLDEN_PASS;
done:
    st_close(f);
    if (st != WKV_GOLDEN_PASS) g_case_free(c);
    return st;
}

/* ============================================================= the float64 reference run */

/* Runs c->op->ref on c's (possibly rounded) float32 data; fills c->ref_*. */
static int g_run_ref(g_case* c, wkv_golden_result* r) {
    g_ref_io io;
    memset(&io, 0, sizeof io);
    double* in[G_MAX_IN] = {0};
    double *s0 = NULL, *dy = NULL, *dsT = NULL;
    int ok = 0;
    for (int i = 0; i < G_MAX_IN; i++) {
        free(c->ref_grad[i]);
        c->ref_grad[i] = NULL;
    }
    free(c->ref_y);
    free(c->ref_sT);
    free(c->ref_ds0);
    c->ref_y = c->ref_sT = c->ref_ds0 = NULL;
    for (int i = 0; i < c->op->num_inputs; i++) {
        in[i] = (double*)malloc(c->in_n[i] * sizeof(double));
        c->ref_grad[i] = (double*)malloc(c->in_n[i] * sizeof(double));
        if (!in[i] || !c->ref_grad[i]) goto done;
        wkvt_load_f64(c->in[i], WKV_DTYPE_F32, in[i], c->in_n[i]);
        io.in[i] = in[i];
        io.grad[i] = c->ref_grad[i];
    }
    s0 = (double*)malloc(c->st_n * sizeof(double));
    dsT = (double*)malloc(c->st_n * sizeof(double));
    dy = (double*)malloc(c->tok_n * sizeof(double));
    c->ref_y = (double*)malloc(c->tok_n * sizeof(double));
    c->ref_sT = (double*)malloc(c->st_n * sizeof(double));
    c->ref_ds0 = (double*)malloc(c->st_n * sizeof(double));
    if (!s0 || !dsT || !dy || !c->ref_y || !c->ref_sT || !c->ref_ds0) goto done;
    wkvt_load_f64(c->s0, WKV_DTYPE_F32, s0, c->st_n);
    wkvt_load_f64(c->dsT, WKV_DTYPE_F32, dsT, c->st_n);
    wkvt_load_f64(c->dy, WKV_DTYPE_F32, dy, c->tok_n);
    io.B = c->B;
    io.T = c->T;
    io.H = c->H;
    io.N = c->N;
    io.form = c->form;
    io.s0 = s0;
    io.dy = dy;
    io.dsT = dsT;
    io.y = c->ref_y;
    io.sT = c->ref_sT;
    io.ds0 = c->ref_ds0;
    c->op->ref(&io);
    ok = 1;
done:
    for (int i = 0; i < G_MAX_IN; i++) free(in[i]);
    free(s0);
    free(dy);
    free(dsT);
    if (!ok) g_msg(r, "out of memory for the float64 reference");
    return ok ? 0 : -1;
}

/* ========================================================================== comparison */

static void g_add(wkv_golden_result* r, const char* name, double err, double tol) {
    if (r->num_tensors >= WKV_GOLDEN_MAX_TENSORS) return;
    wkv_golden_tensor* t = &r->tensors[r->num_tensors++];
    snprintf(t->name, sizeof t->name, "%.*s", (int)sizeof t->name - 1, name);
    t->err = err;
    t->tol = tol;
    t->pass = err <= tol; /* false for NaN and infinity */
}

/* Compares the outputs (library layout) with c->ref_*, fills r->tensors, status, worst. */
static void g_compare(const g_case* c, const double* y, const double* sT,
                      double* const* grad, const double* ds0, double tol_fwd, double tol_grad,
                      wkv_golden_result* r) {
    r->num_tensors = 0;
    g_add(r, "y", wkvt_rel_err(y, c->ref_y, c->tok_n), tol_fwd);
    size_t B = (size_t)c->B, rest = c->part_n / (size_t)c->B;
    double* a = (double*)malloc(c->part_n * sizeof(double));
    double* b = (double*)malloc(c->part_n * sizeof(double));
    for (int pass = 0; pass < 2; pass++) { /* sT parts, then (after the inputs) ds0 parts */
        if (pass == 1)
            for (int i = 0; i < c->op->num_inputs; i++)
                g_add(r, c->op->inputs[i].grad_name,
                      wkvt_rel_err(grad[i], c->ref_grad[i], c->in_n[i]), tol_grad);
        for (int p = 0; p < c->op->num_parts; p++) {
            char name[32];
            snprintf(name, sizeof name, "%s%s", pass ? "ds0" : "sT", c->op->parts[p]);
            double err = INFINITY;
            if (a && b) {
                g_unpack(pass ? ds0 : sT, a, p, c->op->num_parts, B, rest, sizeof(double));
                g_unpack(pass ? c->ref_ds0 : c->ref_sT, b, p, c->op->num_parts, B, rest,
                         sizeof(double));
                err = wkvt_rel_err(a, b, c->part_n);
            }
            g_add(r, name, err, pass ? tol_grad : tol_fwd);
        }
    }
    free(a);
    free(b);

    double worst_ratio = -1.0;
    int failed = 0;
    char list[300] = "";
    size_t o = 0;
    for (int i = 0; i < r->num_tensors; i++) {
        const wkv_golden_tensor* t = &r->tensors[i];
        double ratio = isnan(t->err) ? INFINITY : t->err / t->tol;
        if (ratio > worst_ratio) {
            worst_ratio = ratio;
            r->max_rel_err = t->err;
            snprintf(r->worst, sizeof r->worst, "%s", t->name);
        }
        if (!t->pass) {
            failed++;
            if (o < sizeof list)
                o += (size_t)snprintf(list + o, sizeof list - o, "%s%s=%.2e", o ? ", " : "",
                                      t->name, t->err);
        }
    }
    if (failed) {
        r->status = WKV_GOLDEN_FAIL;
        g_msg(r, "%d of %d tensors above tolerance (fwd %.0e, grad %.0e): %s", failed,
              r->num_tensors, tol_fwd, tol_grad, list);
    } else {
        r->status = WKV_GOLDEN_PASS;
        g_msg(r, "%d tensors within tolerance (fwd %.0e, grad %.0e)", r->num_tensors, tol_fwd,
              tol_grad);
    }
}

/* ========================================================================= library run */

/* Buffers handed to the library, each followed by a guard zone. */
typedef struct g_buf {
    const char* name;
    unsigned char* p;
    size_t nbytes;
    unsigned char* copy; /* inputs: what the buffer must still hold afterwards */
} g_buf;

enum { G_MAX_BUFS = 2 * G_MAX_IN + 8 };

typedef struct g_bufs {
    g_buf b[G_MAX_BUFS];
    int n;
} g_bufs;

static unsigned char g_guard_byte(size_t i) { return (unsigned char)(0xA5u ^ (i * 7u)); }

/* A buffer of nbytes with G_GUARD guard bytes on either side (p points past the front one). */
static void* g_buf_new(g_bufs* bs, const char* name, size_t nbytes) {
    if (bs->n >= G_MAX_BUFS) return NULL;
    unsigned char* base = (unsigned char*)malloc(nbytes + 2 * G_GUARD);
    if (!base) return NULL;
    for (size_t i = 0; i < G_GUARD; i++) {
        base[i] = g_guard_byte(i + 11);
        base[G_GUARD + nbytes + i] = g_guard_byte(i);
    }
    g_buf* b = &bs->b[bs->n++];
    b->name = name;
    b->p = base + G_GUARD;
    b->nbytes = nbytes;
    b->copy = NULL;
    return b->p;
}

/* Remembers the current contents of the last buffer (an input). */
static int g_buf_snapshot(g_bufs* bs) {
    g_buf* b = &bs->b[bs->n - 1];
    b->copy = (unsigned char*)malloc(b->nbytes ? b->nbytes : 1);
    if (!b->copy) return -1;
    memcpy(b->copy, b->p, b->nbytes);
    return 0;
}

/* The first buffer whose guard zones or (for an input) contents changed, or NULL; *what says
 * which: "before the start of", "past the end of", "its input". */
static const char* g_bufs_check(const g_bufs* bs, const char** what) {
    for (int k = 0; k < bs->n; k++) {
        const g_buf* b = &bs->b[k];
        for (size_t i = 0; i < G_GUARD; i++) {
            if (b->p[-(ptrdiff_t)G_GUARD + (ptrdiff_t)i] != g_guard_byte(i + 11)) {
                *what = "the library wrote before the start of";
                return b->name;
            }
            if (b->p[b->nbytes + i] != g_guard_byte(i)) {
                *what = "the library wrote past the end of";
                return b->name;
            }
        }
        if (b->copy && memcmp(b->copy, b->p, b->nbytes) != 0) {
            *what = "the library modified its input";
            return b->name;
        }
    }
    return NULL;
}

static void g_bufs_free(g_bufs* bs) {
    for (int k = 0; k < bs->n; k++) {
        free(bs->b[k].p - G_GUARD);
        free(bs->b[k].copy);
    }
    bs->n = 0;
}

/* dst = src with the last two axes (N x N blocks) transposed. */
static void g_transpose_f32(const float* src, float* dst, size_t blocks, size_t N) {
    for (size_t s = 0; s < blocks; s++)
        for (size_t i = 0; i < N; i++)
            for (size_t j = 0; j < N; j++) dst[s * N * N + j * N + i] = src[s * N * N + i * N + j];
}

static wkv_tensor* g_field(void* desc, size_t offset) {
    return (wkv_tensor*)((char*)desc + offset);
}

/* "WKV_ERROR_SHAPE" from wkv_status_string's "WKV_ERROR_SHAPE: ..." */
static void g_status_name(wkv_status s, char* buf, size_t len) {
    const char* full = wkv_status_string(s);
    size_t n = strcspn(full, ":");
    if (n >= len) n = len - 1;
    memcpy(buf, full, n);
    buf[n] = '\0';
}

/* The library's verdict on a failing call: UNSUPPORTED for WKV_ERROR_UNSUPPORTED, else FAIL. */
static wkv_golden_status g_call_failed(wkv_golden_result* r, wkv_context* ctx, const char* fn,
                                       wkv_status s) {
    char name[64];
    g_status_name(s, name, sizeof name);
    const char* why = wkv_last_error(ctx);
    /* The library's message normally names the function already. */
    int named = why && !strncmp(why, fn, strlen(fn));
    if (s == WKV_ERROR_UNSUPPORTED) {
        if (named) g_msg(r, "unsupported: %s", why);
        else g_msg(r, "unsupported: %s: %s", fn, (why && *why) ? why : name);
        return WKV_GOLDEN_UNSUPPORTED;
    }
    if (named) g_msg(r, "%s (%s)", why, name);
    else g_msg(r, "%s returned %s: %s", fn, name, why ? why : "");
    return WKV_GOLDEN_FAIL;
}

/* Runs forward + backward through the public API; fills the double outputs (library layout,
 * states value-major). Returns PASS when both calls succeeded and every buffer checks out. */
static wkv_golden_status g_run_library(const g_case* c, const wkv_golden_options* o,
                                       wkv_golden_result* r, double* y, double* sT,
                                       double* const* grad, double* ds0) {
    const g_op* op = c->op;
    const wkv_dtype dt = o->dtype;
    const size_t es = wkvt_dtype_size(dt);
    const int km = o->state_key_major && op->layout == G_BTHN;
    const size_t blocks = (size_t)(c->B * c->H), N = (size_t)c->N;
    const size_t st_bytes = c->st_n * sizeof(float);
    wkv_golden_status st = WKV_GOLDEN_ERROR;
    wkv_context* ctx = NULL;
    g_bufs bs;
    bs.n = 0;
    float* tmp = NULL;
    void* ws = NULL;
    size_t ws_size = 0;

    wkv_context_options co;
    memset(&co, 0, sizeof co);
    co.struct_size = sizeof co;
    co.backend = o->backend;
    co.device_index = o->device_index;
    co.cpu_threads = o->cpu_threads;
    wkv_status s = wkv_context_create(&co, &ctx);
    if (s != WKV_OK) {
        char name[64];
        g_status_name(s, name, sizeof name);
        const char* why = wkv_last_error(NULL);
        g_msg(r, "cannot create a context (backend %s): %s: %s", wkvt_backend_name(o->backend), name,
              why ? why : "");
        return WKV_GOLDEN_ERROR;
    }
    r->backend = wkv_context_backend(ctx);
    {
        wkv_device_info di;
        memset(&di, 0, sizeof di);
        di.struct_size = sizeof di;
        if (wkv_device_get_info(r->backend, o->device_index, &di) == WKV_OK) {
            di.name[sizeof di.name - 1] = '\0';
            snprintf(r->device, sizeof r->device, "%s", di.name);
        }
    }

    if (km && !(tmp = (float*)malloc(st_bytes))) goto oom;

    wkv_forward_desc fd;
    memset(&fd, 0, sizeof fd);
    fd.struct_size = sizeof fd;
    fd.op = op->op;
    fd.decay_form = c->form;
    fd.flags = km ? (uint32_t)WKV_FLAG_STATE_KEY_MAJOR : 0u;
    for (int i = 0; i < op->num_inputs; i++) {
        void* p = g_buf_new(&bs, op->inputs[i].name, c->in_n[i] * es);
        if (!p) goto oom;
        wkvt_store_f32(c->in[i], p, dt, c->in_n[i]);
        if (g_buf_snapshot(&bs)) goto oom;
        *g_field(&fd, op->inputs[i].fwd_field) = wkv_tensor_make(p, dt, c->in_ndim[i], c->in_shape[i]);
    }
    void* yb = g_buf_new(&bs, "y", c->tok_n * es);
    float* s0b = (float*)g_buf_new(&bs, "state_in", st_bytes);
    if (!yb || !s0b) goto oom;
    if (km) g_transpose_f32(c->s0, s0b, blocks, N);
    else memcpy(s0b, c->s0, st_bytes);
    if (g_buf_snapshot(&bs)) goto oom;
    float* sTb = (float*)g_buf_new(&bs, "state_out", st_bytes);
    if (!sTb) goto oom;
    wkvt_fill_nan(yb, dt, c->tok_n);
    wkvt_fill_nan(sTb, WKV_DTYPE_F32, c->st_n);
    fd.y = wkv_tensor_make(yb, dt, c->tok_ndim, c->tok_shape);
    fd.state_in = wkv_tensor_make(s0b, WKV_DTYPE_F32, c->st_ndim, c->st_shape);
    fd.state_out = wkv_tensor_make(sTb, WKV_DTYPE_F32, c->st_ndim, c->st_shape);

    s = wkv_forward(ctx, &fd);
    if (s != WKV_OK) {
        st = g_call_failed(r, ctx, "wkv_forward", s);
        goto done;
    }

    wkv_backward_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.struct_size = sizeof bd;
    bd.forward = &fd;
    float* dyb = (float*)g_buf_new(&bs, "dy", c->tok_n * sizeof(float));
    if (!dyb) goto oom;
    memcpy(dyb, c->dy, c->tok_n * sizeof(float));
    if (g_buf_snapshot(&bs)) goto oom;
    float* dsTb = (float*)g_buf_new(&bs, "dstate_out", st_bytes);
    if (!dsTb) goto oom;
    if (km) g_transpose_f32(c->dsT, dsTb, blocks, N);
    else memcpy(dsTb, c->dsT, st_bytes);
    if (g_buf_snapshot(&bs)) goto oom;
    bd.dy = wkv_tensor_make(dyb, WKV_DTYPE_F32, c->tok_ndim, c->tok_shape);
    bd.dstate_out = wkv_tensor_make(dsTb, WKV_DTYPE_F32, c->st_ndim, c->st_shape);
    void* gb[G_MAX_IN] = {0};
    for (int i = 0; i < op->num_inputs; i++) {
        if (!(gb[i] = g_buf_new(&bs, op->inputs[i].grad_name, c->in_n[i] * es))) goto oom;
        wkvt_fill_nan(gb[i], dt, c->in_n[i]);
        *g_field(&bd, op->inputs[i].grad_field) =
            wkv_tensor_make(gb[i], dt, c->in_ndim[i], c->in_shape[i]);
    }
    float* ds0b = (float*)g_buf_new(&bs, "dstate_in", st_bytes);
    if (!ds0b) goto oom;
    wkvt_fill_nan(ds0b, WKV_DTYPE_F32, c->st_n);
    bd.dstate_in = wkv_tensor_make(ds0b, WKV_DTYPE_F32, c->st_ndim, c->st_shape);

    s = wkv_workspace_size(ctx, &ws_size, &bd);
    if (s != WKV_OK) {
        st = g_call_failed(r, ctx, "wkv_workspace_size", s);
        goto done;
    }
    if (!(ws = g_buf_new(&bs, "workspace", ws_size))) goto oom;
    memset(ws, 0xFF, ws_size); /* NaN in every float format */
    bd.workspace = ws_size ? ws : NULL;
    bd.workspace_size = ws_size;

    s = wkv_backward(ctx, &bd);
    if (s != WKV_OK) {
        st = g_call_failed(r, ctx, "wkv_backward", s);
        goto done;
    }

    const char* what = "";
    const char* bad = g_bufs_check(&bs, &what);
    if (bad) {
        g_msg(r, "%s \"%s\"", what, bad);
        st = WKV_GOLDEN_FAIL;
        goto done;
    }

    wkvt_load_f64(yb, dt, y, c->tok_n);
    for (int i = 0; i < op->num_inputs; i++) wkvt_load_f64(gb[i], dt, grad[i], c->in_n[i]);
    if (km) {
        g_transpose_f32(sTb, tmp, blocks, N);
        wkvt_load_f64(tmp, WKV_DTYPE_F32, sT, c->st_n);
        g_transpose_f32(ds0b, tmp, blocks, N);
        wkvt_load_f64(tmp, WKV_DTYPE_F32, ds0, c->st_n);
    } else {
        wkvt_load_f64(sTb, WKV_DTYPE_F32, sT, c->st_n);
        wkvt_load_f64(ds0b, WKV_DTYPE_F32, ds0, c->st_n);
    }
    st = WKV_GOLDEN_PASS;
    goto done;
oom:
    g_msg(r, "out of memory");
    st = WKV_GOLDEN_ERROR;
done:
    g_bufs_free(&bs);
    free(tmp);
    wkv_context_destroy(ctx);
    return st;
}

/* ================================================================================ public */

static void g_result_init(wkv_golden_result* r, wkv_backend backend, wkv_dtype dtype) {
    memset(r, 0, sizeof *r);
    r->status = WKV_GOLDEN_ERROR;
    r->backend = backend;
    r->dtype = dtype;
    r->max_rel_err = NAN;
}

wkv_golden_status wkv_golden_run(const char* path, wkv_backend backend, wkv_dtype dtype,
                                 wkv_golden_result* out) {
    wkv_golden_options o;
    memset(&o, 0, sizeof o);
    o.backend = backend;
    o.dtype = dtype;
    return wkv_golden_run_ex(path, &o, out);
}

wkv_golden_status wkv_golden_run_ex(const char* path, const wkv_golden_options* o,
                                    wkv_golden_result* r) {
    if (!r) return WKV_GOLDEN_ERROR;
    if (!o) {
        g_result_init(r, WKV_BACKEND_AUTO, WKV_DTYPE_F32);
        g_msg(r, "NULL options");
        return r->status;
    }
    g_result_init(r, o->backend, o->dtype);
    if (!path) {
        g_msg(r, "NULL path");
        return r->status;
    }
    const size_t es = wkvt_dtype_size(o->dtype);
    if (es == 0) {
        g_msg(r, "dtype must be f32, f16 or bf16");
        return r->status;
    }
    const int is16 = es == 2;

    g_case c;
    wkv_golden_status st = g_load(path, &c, !is16, r);
    if (st != WKV_GOLDEN_PASS) {
        r->status = st;
        return st;
    }
    if (is16)
        for (int i = 0; i < c.op->num_inputs; i++) wkvt_round_f32(c.in[i], o->dtype, c.in_n[i]);

    double* y = (double*)malloc(c.tok_n * sizeof(double));
    double* sT = (double*)malloc(c.st_n * sizeof(double));
    double* ds0 = (double*)malloc(c.st_n * sizeof(double));
    double* grad[G_MAX_IN] = {0};
    int oom = !y || !sT || !ds0;
    for (int i = 0; i < c.op->num_inputs; i++)
        if (!(grad[i] = (double*)malloc(c.in_n[i] * sizeof(double)))) oom = 1;
    if (oom) {
        g_msg(r, "out of memory");
        st = WKV_GOLDEN_ERROR;
        goto done;
    }

    st = g_run_library(&c, o, r, y, sT, grad, ds0);
    if (st != WKV_GOLDEN_PASS) goto done;

    if (is16) {
        if (!c.op->ref) {
            g_msg(r, "unsupported: the %s run succeeded but cannot be checked in %s: %s",
                  c.op->name, wkvt_dtype_name(o->dtype), c.op->no_ref);
            st = WKV_GOLDEN_UNSUPPORTED;
            goto done;
        }
        if (g_run_ref(&c, r)) {
            st = WKV_GOLDEN_ERROR;
            goto done;
        }
        g_compare(&c, y, sT, grad, ds0, WKV_GOLDEN_TOL_16BIT_FORWARD, WKV_GOLDEN_TOL_16BIT_GRAD,
                  r);
    } else {
        g_compare(&c, y, sT, grad, ds0, WKV_GOLDEN_TOL_F32, WKV_GOLDEN_TOL_F32, r);
    }
    st = r->status;
done:
    free(y);
    free(sT);
    free(ds0);
    for (int i = 0; i < G_MAX_IN; i++) free(grad[i]);
    g_case_free(&c);
    r->status = st;
    return st;
}

wkv_golden_status wkv_golden_run_reference(const char* path, wkv_golden_result* r) {
    if (!r) return WKV_GOLDEN_ERROR;
    g_result_init(r, WKV_BACKEND_AUTO, WKV_DTYPE_F32);
    snprintf(r->device, sizeof r->device, "float64 reference");
    if (!path) {
        g_msg(r, "NULL path");
        return r->status;
    }
    g_case c;
    wkv_golden_status st = g_load(path, &c, 1, r);
    if (st != WKV_GOLDEN_PASS) {
        r->status = st;
        return st;
    }
    if (!c.op->ref) {
        g_msg(r, "unsupported: %s", c.op->no_ref);
        g_case_free(&c);
        r->status = WKV_GOLDEN_UNSUPPORTED;
        return r->status;
    }
    /* Keep the file's references, compute the reference's outputs into a second case. */
    g_case mine = c;
    for (int i = 0; i < G_MAX_IN; i++) mine.ref_grad[i] = NULL;
    mine.ref_y = mine.ref_sT = mine.ref_ds0 = NULL;
    if (g_run_ref(&mine, r)) {
        st = WKV_GOLDEN_ERROR;
    } else {
        g_compare(&c, mine.ref_y, mine.ref_sT, mine.ref_grad, mine.ref_ds0,
                  WKV_GOLDEN_TOL_REFERENCE, WKV_GOLDEN_TOL_REFERENCE, r);
        st = r->status;
    }
    for (int i = 0; i < G_MAX_IN; i++) free(mine.ref_grad[i]);
    free(mine.ref_y);
    free(mine.ref_sT);
    free(mine.ref_ds0);
    g_case_free(&c); /* frees the shared inputs once */
    r->status = st;
    return st;
}

int wkv_golden_backend_claims(const wkv_backend_info* info, const wkv_golden_result* r,
                              char* why, size_t whylen) {
    char dummy[8];
    if (!why || !whylen) {
        why = dummy;
        whylen = sizeof dummy;
    }
    why[0] = '\0';
    if (!info || !r || !r->op) {
        snprintf(why, whylen, "no case");
        return 0;
    }
    if (!info->available) {
        snprintf(why, whylen, "backend %s unavailable", info->name ? info->name : "?");
        return 0;
    }
    if ((int)r->op < 0 || (int)r->op > 31 || !(info->ops & (1u << (unsigned)r->op))) {
        snprintf(why, whylen, "op %s not claimed", wkvt_op_name(r->op));
        return 0;
    }
    if (!(info->dtypes & wkvt_dtype_bit(r->dtype))) {
        snprintf(why, whylen, "dtype %s not claimed", wkvt_dtype_name(r->dtype));
        return 0;
    }
    if ((int)r->decay_form < 0 || (int)r->decay_form > 31 ||
        !(info->decay_forms & (1u << (unsigned)r->decay_form))) {
        snprintf(why, whylen, "decay form %s not claimed", wkvt_decay_form_name(r->decay_form));
        return 0;
    }
    if (!r->per_channel && !info->any_head_size) {
        int found = 0;
        int n = info->num_head_sizes;
        if (n > WKV_MAX_HEAD_SIZES) n = WKV_MAX_HEAD_SIZES;
        for (int i = 0; i < n; i++) found |= info->head_sizes[i] == r->N;
        if (!found) {
            snprintf(why, whylen, "head size %lld not claimed", (long long)r->N);
            return 0;
        }
    }
    return 1;
}

const char* wkv_golden_status_name(wkv_golden_status s) {
    switch (s) {
    case WKV_GOLDEN_PASS: return "PASS";
    case WKV_GOLDEN_FAIL: return "FAIL";
    case WKV_GOLDEN_UNSUPPORTED: return "UNSUPPORTED";
    case WKV_GOLDEN_ERROR: return "ERROR";
    default: return "?";
    }
}

void wkv_golden_format(const wkv_golden_result* r, char* buf, size_t len) {
    if (!buf || !len) return;
    if (!r) {
        snprintf(buf, len, "FAIL (no result)");
        return;
    }
    const char* be = wkvt_backend_name(r->backend);
    const char* dt = wkvt_dtype_name(r->dtype);
    switch (r->status) {
    case WKV_GOLDEN_PASS:
        snprintf(buf, len, "PASS  max_rel_err=%.1e (%s)  %s %s", r->max_rel_err, r->worst, be,
                 dt);
        break;
    case WKV_GOLDEN_FAIL:
        if (r->num_tensors)
            snprintf(buf, len, "FAIL  max_rel_err=%.1e (%s)  %s %s  %s", r->max_rel_err,
                     r->worst, be, dt, r->message);
        else
            snprintf(buf, len, "FAIL  %s  %s %s", r->message, be, dt);
        break;
    case WKV_GOLDEN_UNSUPPORTED:
        snprintf(buf, len, "FAIL %s  %s %s", r->message, be, dt);
        break;
    default:
        snprintf(buf, len, "FAIL error: %s  %s %s", r->message, be, dt);
        break;
    }
}

/* "<the executable's folder>/<rel>" when that is a directory (an installed wkv-bench and the
 * golden files installed with it), else NULL. Linux (/proc); elsewhere NULL. */
static const char* g_installed_dir(const char* rel) {
    static char dir[4096];
    static int tried;
    if (tried) return dir[0] ? dir : NULL;
    tried = 1;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = '\0';
    char* slash = strrchr(exe, '/');
    if (!slash) return NULL;
    *slash = '\0';
    struct stat st;
    if (snprintf(dir, sizeof dir, "%s/%s", exe, rel) >= (int)sizeof dir || stat(dir, &st) ||
        !S_ISDIR(st.st_mode))
        dir[0] = '\0';
    return dir[0] ? dir : NULL;
}

const char* wkv_golden_dir(void) {
    const char* e = getenv("WKV_GOLDEN_DIR");
    if (e && *e) return e;
#ifdef WKV_INSTALLED_GOLDEN_DIR
    const char* installed = g_installed_dir(WKV_INSTALLED_GOLDEN_DIR);
    if (installed) return installed;
#endif
#ifdef WKV_DEFAULT_GOLDEN_DIR
    return WKV_DEFAULT_GOLDEN_DIR;
#else
    return "tests/golden";
#endif
}

static int g_cmp_str(const void* a, const void* b) {
    return strcmp(*(const char* const*)a, *(const char* const*)b);
}

int wkv_golden_list(const char* dir, char*** paths, size_t* count, char* err, size_t errlen) {
    if (!paths || !count) return -1;
    *paths = NULL;
    *count = 0;
    if (!dir) dir = wkv_golden_dir();
    DIR* d = opendir(dir);
    if (!d) {
        if (err && errlen) snprintf(err, errlen, "cannot open %s: %s", dir, strerror(errno));
        return -1;
    }
    char** list = NULL;
    size_t n = 0, cap = 0;
    const char* suffix = ".safetensors";
    size_t sl = strlen(suffix);
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        if (nl <= sl || e->d_name[0] == '.' || strcmp(e->d_name + nl - sl, suffix) != 0)
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 32;
            char** grown = (char**)realloc(list, nc * sizeof *grown);
            if (!grown) goto oom;
            list = grown;
            cap = nc;
        }
        size_t pl = strlen(dir) + 1 + nl + 1;
        if (!(list[n] = (char*)malloc(pl))) goto oom;
        snprintf(list[n], pl, "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    if (n) qsort(list, n, sizeof *list, g_cmp_str);
    *paths = list;
    *count = n;
    return 0;
oom:
    closedir(d);
    wkv_golden_list_free(list, n);
    if (err && errlen) snprintf(err, errlen, "out of memory listing %s", dir);
    return -1;
}

void wkv_golden_list_free(char** paths, size_t count) {
    if (!paths) return;
    for (size_t i = 0; i < count; i++) free(paths[i]);
    free(paths);
}
