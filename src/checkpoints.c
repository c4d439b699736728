#include "checkpoints.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "message.h"

/* What a backward's checkpoints depend on, besides the input values: every field that makes
 * the backend compute or lay them out differently. The views' strides already hold the state
 * flags (backend.h). Data pointers are left out: the inputs may be given again at other
 * addresses (the caller promises equal values, which no check could see anyway). */
typedef struct fingerprint {
    int32_t op, decay_form;
    uint32_t flags;
    int32_t elem[8]; /* r w k v a b u state_in; -1 = absent */
    int64_t B, T, H, N, num_seqs;
    int64_t stride[8][4];
    uint64_t offsets_hash; /* packed: FNV-1a of seq_offsets; 0 otherwise */
} fingerprint;

typedef struct record {
    uintptr_t lo, hi; /* the workspace's bytes */
    int saved;
    fingerprint fp;
} record;

struct wkv_ckpt_records {
    record* r;
    size_t n, cap;
};

static void make_fingerprint(const wkv_problem* p, fingerprint* fp) {
    memset(fp, 0, sizeof *fp); /* padding too: records are compared with memcmp */
    fp->op = (int32_t)p->op;
    fp->decay_form = (int32_t)p->decay_form;
    fp->flags = p->flags;
    fp->B = p->B, fp->T = p->T, fp->H = p->H, fp->N = p->N;
    fp->num_seqs = p->num_seqs;
    const wkv_view* views[8] = {&p->r, &p->w, &p->k, &p->v, &p->a, &p->b, &p->u, &p->state_in};
    for (int i = 0; i < 8; ++i) {
        fp->elem[i] = views[i]->data ? (int32_t)views[i]->elem : -1;
        if (views[i]->data) memcpy(fp->stride[i], views[i]->stride, sizeof fp->stride[i]);
    }
    if (p->seq_offsets) {
        uint64_t h = 14695981039346656037ull;
        const unsigned char* b = (const unsigned char*)p->seq_offsets;
        for (size_t i = 0; i < (size_t)(p->num_seqs + 1) * sizeof(int64_t); ++i)
            h = (h ^ b[i]) * 1099511628211ull;
        fp->offsets_hash = h;
    }
}

void wkv_ckpt_records_destroy(wkv_ckpt_records* recs) {
    if (!recs) return;
    free(recs->r);
    free(recs);
}

/* At most this many records per context: a caller that never reuses a workspace address
 * (a fresh allocation per step that the allocator never hands out again) must not grow the
 * list forever; past it the oldest record goes (a backward asking to reuse it is then refused,
 * as for any workspace the context knows nothing of). 65536 workspaces in use at once is far
 * beyond a model's layer count. */
enum { WKV_CKPT_MAX_RECORDS = 65536 };

int wkv_ckpt_reserve(wkv_ckpt_records** recs) {
    if (!*recs && !(*recs = (wkv_ckpt_records*)calloc(1, sizeof **recs))) return 0;
    wkv_ckpt_records* x = *recs;
    if (x->n == WKV_CKPT_MAX_RECORDS) { /* forget the oldest */
        memmove(&x->r[0], &x->r[1], (x->n - 1) * sizeof *x->r);
        --x->n;
    }
    if (x->n < x->cap) return 1;
    size_t cap = x->cap ? 2 * x->cap : 16;
    record* grown = (record*)realloc(x->r, cap * sizeof *grown);
    if (!grown) return 0;
    x->r = grown;
    x->cap = cap;
    return 1;
}

void wkv_ckpt_forget(wkv_ckpt_records* recs, const void* ws, size_t size) {
    if (!recs || !ws) return;
    const uintptr_t lo = (uintptr_t)ws, hi = lo + (size ? size : 1);
    size_t kept = 0;
    for (size_t i = 0; i < recs->n; ++i)
        if (recs->r[i].hi <= lo || hi <= recs->r[i].lo) recs->r[kept++] = recs->r[i];
    recs->n = kept;
}

void wkv_ckpt_note_forward(wkv_ckpt_records* recs, const wkv_problem* p, const void* ws, size_t size,
                           int saved) {
    wkv_ckpt_forget(recs, ws, size);
    record* r = &recs->r[recs->n++]; /* room made by wkv_ckpt_reserve; forget only shrinks */
    r->lo = (uintptr_t)ws;
    r->hi = r->lo + (size ? size : 1);
    r->saved = saved;
    make_fingerprint(p, &r->fp);
}

wkv_status wkv_ckpt_lookup(const wkv_ckpt_records* recs, const wkv_problem* p, const void* ws,
                           int* saved, wkv_message* msg) {
    *saved = 0;
    const record* found = NULL;
    for (size_t i = 0; recs && ws && i < recs->n && !found; ++i)
        if (recs->r[i].lo == (uintptr_t)ws) found = &recs->r[i];
    if (!found)
        return wkv_fail(msg, WKV_ERROR_INVALID_ARGUMENT,
                        "desc->flags has WKV_BACKWARD_REUSE_CHECKPOINTS, but desc->workspace holds no "
                        "checkpoints of a forward on this context (give the forward descriptor this "
                        "workspace, and run no other call on it in between)");
    fingerprint fp;
    make_fingerprint(p, &fp);
    if (memcmp(&fp, &found->fp, sizeof fp) != 0)
        return wkv_fail(msg, WKV_ERROR_INVALID_ARGUMENT,
                        "desc->flags has WKV_BACKWARD_REUSE_CHECKPOINTS, but the checkpoints in "
                        "desc->workspace are of a forward with another descriptor (op, decay form, "
                        "flags, dtypes, shapes, strides, packing or state_in differ from desc->forward)");
    *saved = found->saved;
    return WKV_OK;
}
