/* What a context knows about the checkpoints saving forwards left in workspaces (wkv.h's
 * USAGE, Training): one record per workspace address, with the fingerprint of the problem the
 * forward ran and whether the backend really saved. A backward with
 * WKV_BACKWARD_REUSE_CHECKPOINTS is accepted only against a matching record. */
#ifndef WKV_SRC_CHECKPOINTS_H
#define WKV_SRC_CHECKPOINTS_H

#include "backend.h"

typedef struct wkv_ckpt_records wkv_ckpt_records;

/* Accepts NULL. */
void wkv_ckpt_records_destroy(wkv_ckpt_records* recs);

/* Makes room for one more record (before the forward runs, so that it cannot fail after
 * writing): 0 when out of memory. Creates *recs on first use. */
int wkv_ckpt_reserve(wkv_ckpt_records** recs);

/* After a forward of p with workspace [ws, ws + size) (after wkv_ckpt_reserve): forgets every
 * record that overlaps it and records this one; `saved`: the backend wrote the checkpoints. */
void wkv_ckpt_note_forward(wkv_ckpt_records* recs, const wkv_problem* p, const void* ws, size_t size,
                           int saved);

/* Before a backward of p whose workspace is [ws, ws + size) and that will not reuse a record:
 * forgets every record that overlaps it (the backward overwrites the checkpoints). */
void wkv_ckpt_forget(wkv_ckpt_records* recs, const void* ws, size_t size);

/* A backward of p asking to reuse the checkpoints in workspace ws: WKV_OK with *saved (1: the
 * backend saved them, reuse; 0: the forward ran on a backend that does not save, recompute),
 * or WKV_ERROR_INVALID_ARGUMENT with a message naming desc->workspace. */
wkv_status wkv_ckpt_lookup(const wkv_ckpt_records* recs, const wkv_problem* p, const void* ws,
                           int* saved, wkv_message* msg);

#endif
