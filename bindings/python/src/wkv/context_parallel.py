"""Context parallelism: one long sequence split into segments that run at the same time, on
several processes (``torch.distributed``) or as the batch of one call, stitched together by
composing each segment's state transition.

RWKV-7's state update is affine in the state: S_t = S_{t-1} M_t + v_t k_t^T with
M_t = diag(w_t) + a_t b_t^T (acting on the key axis). So a segment maps its initial state S to
S A + B, where A = M_1 ... M_L (N x N per head) and B is the segment's final state from zero.
Both come from libwkv's own op: B by running the segment from a zero state, A by running it
from the identity with v = 0. Transitions compose associatively,
(A1, B1) then (A2, B2) = (A1 A2, B1 A2 + B2), so every segment's true initial state follows
from the transitions of the segments before it (an exchange of H N^2 floats per segment). The
outputs need no third run: y_t = S_t r_t is linear in the initial state too, and the run from
the identity with v = 0 has S_t = M_1 ... M_t, so its outputs are y1_t = M_1 ... M_t r_t and the
true y_t = y0_t + S y1_t (y0: the run from zeros). Cost: two forwards of the segment and a
product of H N^2 per token, against one forward of the whole sequence on one worker; the
backward is the two runs' backwards (autograd; the op's backward gives the state gradient, the
exchange is an all_gather whose backward all-reduces the gradients). So it pays with more than
two workers, segments long against N.

RWKV-6/5 have the same form with a diagonal A (the per-column product of the decays; u only
touches y, and the run with v = 0 has no bonus term). RWKV-4's state is the log-space triple
(aa, bb, pp) (true numerator aa e^pp, denominator bb e^pp): in linear space each channel decays by e^wd per token (wd = -exp(w), one
value per channel, time-invariant), so a segment of L tokens maps a start (aa0, bb0, pp0) to
its zero-start end (aaS, bbS, ppS) plus the start decayed by e^(L wd); this module applies that
in log space (p = max(pp0 + L wd, ppS), every exponent <= 0), so its transition is
(aaS, bbS, ppS, L wd) per channel: C floats, not N^2. Its y is not linear in the state (a
ratio), so each segment runs once more from its true start: two forwards too.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

__all__ = ["segment_transition_rwkv7", "segment_transition_rwkv6", "segment_transition_rwkv4", "compose",
           "compose_rwkv4", "rwkv7_segmented", "rwkv6_segmented", "rwkv4_segmented", "context_parallel_rwkv7",
           "context_parallel_rwkv6", "context_parallel_rwkv4"]


def _op(name: str = "rwkv7"):
    from . import torch as wt

    return getattr(wt, name)


# The ops split here take per-token inputs (split along T; RWKV-7 r w k v a b, RWKV-6 r w k v,
# RWKV-4 k v) and shared ones (RWKV-6 u, RWKV-4 w u).
_PP_EMPTY = -1e38  # RWKV-4's pp of the zero state (wkv.h)


def _values(name, tokens) -> torch.Tensor:
    """The per-token v: its shape is the segment's ([B, L, H, N]; RWKV-4 [B, L, C])."""
    return tokens[-1] if name == "rwkv4" else tokens[3]


def _run(name, tokens, shared, state, decay, context):
    """The op on a segment (or a batch of them) from `state` (None: zeros)."""
    if name == "rwkv4":  # w, u first; its decay form is fixed
        return _op(name)(*shared, *tokens, state, context=context)
    return _op(name)(*tokens, *shared, state, decay=decay, context=context)


def _transition(name, tokens, shared, decay, context):
    """A segment's transition as one tensor and the runs' outputs that give its y (_outputs):
    RWKV-7/6 stack([A, B]) [2, B, H, N, N], A from the identity with v = 0 and B from zeros, and
    their outputs (y1, y0); RWKV-4 [B, 4, C]: its zero-start end (aa, bb, pp) and L wd, and
    None."""
    v = _values(name, tokens)
    if name == "rwkv4":
        Bsz, L, C = v.shape
        _, end = _run(name, tokens, shared, None, decay, context)
        ld = (-torch.exp(shared[0].float()) * L).expand(Bsz, 1, C)
        return torch.cat([end, ld], 1), None
    Bsz, _, H, N = v.shape
    y0, Bst = _run(name, tokens, shared, _zero_state(name, tokens), decay, context)
    no_v = list(tokens)
    no_v[3] = torch.zeros((), dtype=v.dtype, device=v.device).expand(v.shape)  # a broadcast zero: no memory
    y1, A = _run(name, no_v, shared, _identity(Bsz, H, N, v), decay, context)
    return torch.stack([A, Bst]), (y1, y0)


def _outputs(name, tokens, shared, start, tr, runs, decay, context):
    """(y, end state) of a segment (or a batch of them) from its true start: y0 + start y1 and
    start A + B for RWKV-7/6 (y_t[v] = y0_t[v] + sum_i start[v][i] y1_t[i], float32 sums), the run
    from start for RWKV-4."""
    if runs is None:
        return _run(name, tokens, shared, start, decay, context)
    y1, y0 = runs
    return _Correct.apply(y0, y1, start), _apply(name, start, tr)


class _Correct(torch.autograd.Function):
    """y = y0 + start y1 per token and head (RWKV-7/6, [B, T, H, N], start [B, H, N, N]), as
    batched GEMMs on [H, T, N] views, one per batch row, with no copies; the backward alike.
    (An einsum took 2.5x as long: it copies y1 and y into [B, H, T, N]. Autograd through
    in-place GEMMs on views copied the whole gradient once per batch row.)"""

    @staticmethod
    def forward(ctx, y0, y1, start):
        y, z = y0.float(), y1.float()
        if y is y0:
            ctx.mark_dirty(y0)  # float32 y0 is updated in place: nothing saved it
        for b in range(y.shape[0]):
            y[b].transpose(0, 1).baddbmm_(z[b].transpose(0, 1), start[b].transpose(-1, -2))
        ctx.save_for_backward(y1, start)
        ctx.y0_dtype = y0.dtype
        return y.to(y0.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        y1, start = ctx.saved_tensors
        g, z = dy.float(), y1.float()
        dz = torch.empty_like(z)
        dstart = torch.empty_like(start)
        for b in range(g.shape[0]):
            gb = g[b].transpose(0, 1)  # [H, T, N]
            dz[b].transpose(0, 1).baddbmm_(gb, start[b], beta=0)  # beta = 0: dz's contents are not read
            torch.bmm(gb.transpose(1, 2), z[b].transpose(0, 1), out=dstart[b])
        return dy.to(ctx.y0_dtype), dz.to(y1.dtype), dstart


def _identity_transition(name, tokens) -> torch.Tensor:
    """The transition of an empty segment (a rank with no tokens): the state passes unchanged
    (RWKV-4: the zero state's end and no decay; RWKV-7/6: A = I, B = 0)."""
    v, zero = _values(name, tokens), _zero_state(name, tokens)
    if name == "rwkv4":
        return torch.cat([zero, torch.zeros_like(zero[:, :1])], 1)
    Bsz, _, H, N = v.shape
    return torch.stack([_identity(Bsz, H, N, v), zero])


def _apply(name, state: torch.Tensor, tr: torch.Tensor) -> torch.Tensor:
    """The state after a segment with transition `tr`, from `state` at its start."""
    if name != "rwkv4":
        return state @ tr[0] + tr[1]
    aa0, bb0, pp0 = state[:, 0], state[:, 1], state[:, 2]
    aaS, bbS, ppS, ld = tr[:, 0], tr[:, 1], tr[:, 2], tr[:, 3]
    p0 = pp0 + ld
    p = torch.maximum(p0, ppS)
    e0, eS = torch.exp(p0 - p), torch.exp(ppS - p)
    return torch.stack([aa0 * e0 + aaS * eS, bb0 * e0 + bbS * eS, p], 1)


def _zero_state(name, tokens) -> torch.Tensor:
    v = _values(name, tokens)
    if name == "rwkv4":
        z = torch.zeros(v.shape[0], 3, v.shape[2], dtype=torch.float32, device=v.device)
        z[:, 2] = _PP_EMPTY
        return z
    Bsz, _, H, N = v.shape
    return torch.zeros(Bsz, H, N, N, dtype=torch.float32, device=v.device)


def _identity(B: int, H: int, N: int, like: torch.Tensor) -> torch.Tensor:
    return torch.eye(N, dtype=torch.float32, device=like.device).expand(B, H, N, N).contiguous()


def segment_transition_rwkv7(r, w, k, v, a, b, *, decay="clampw", context=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(A, B) of a segment [B, L, H, N]: its final state is S A + B for an initial state S
    (A, B: [B, H, N, N] float32; S A multiplies S's key axis by A)."""
    tr, _ = _transition("rwkv7", (r, w, k, v, a, b), (), decay, context)
    return tr[0], tr[1]


def segment_transition_rwkv6(r, w, k, v, u, *, decay="exp_neg_exp", context=None):
    """RWKV-6/5's (A, B): A is diagonal (the product of the segment's decays per key column),
    returned as the full matrix."""
    tr, _ = _transition("rwkv6", (r, w, k, v), (u,), decay, context)
    return tr[0], tr[1]


def segment_transition_rwkv4(w, u, k, v, *, context=None) -> torch.Tensor:
    """RWKV-4's transition of a segment k, v [B, L, C]: [B, 4, C] float32, its final state from
    the zero state (aa, bb, pp) and L wd (wd = -exp(w)), what :func:`compose_rwkv4` combines."""
    return _transition("rwkv4", (k, v), (w, u), None, context)[0]


def compose_rwkv4(first: torch.Tensor, then: torch.Tensor) -> torch.Tensor:
    """RWKV-4's transition of `first` followed by `then` (each [B, 4, C])."""
    end = _apply("rwkv4", first[:, :3], then)
    return torch.cat([end, (first[:, 3] + then[:, 3]).unsqueeze(1)], 1)


def compose(first: Tuple[torch.Tensor, torch.Tensor], then: Tuple[torch.Tensor, torch.Tensor]):
    """The transition of `first` followed by `then`: (A1 A2, B1 A2 + B2)."""
    (A1, B1), (A2, B2) = first, then
    return A1 @ A2, B1 @ A2 + B2


def _starts(name, state: Optional[torch.Tensor], transitions: Sequence[torch.Tensor], tokens) -> List[torch.Tensor]:
    """The true initial state of every segment, from the initial state and the transitions."""
    s = state if state is not None else _zero_state(name, tokens)
    out = []
    for tr in transitions:
        out.append(s)
        s = _apply(name, s, tr)
    return out


def _segmented(name, tokens, shared, state, segments, decay, context):
    Bsz, T = _values(name, tokens).shape[:2]
    if Bsz != 1 or segments < 1 or T % segments:
        raise ValueError("%s_segmented: needs B = 1 and T (%d) a multiple of segments (%d)" % (name, T, segments))
    P, L = segments, T // segments
    seg = [x.reshape(P, L, *x.shape[2:]) for x in tokens]  # the segments as a batch
    tr, runs = _transition(name, seg, shared, decay, context)
    per = [tr[i:i + 1] for i in range(P)] if name == "rwkv4" else [tr[:, i:i + 1] for i in range(P)]
    first = [x[:1, :1] for x in seg]
    starts = _starts(name, state, per, first)
    y, s_end = _outputs(name, seg, shared, torch.cat(starts, 0), tr, runs, decay, context)
    return y.reshape(1, T, *y.shape[2:]), s_end[P - 1:P]


def rwkv7_segmented(r, w, k, v, a, b, state=None, *, segments: int, decay="clampw", context=None):
    """One device, T split into `segments` segments that run as the batch of each call (a call
    from zeros and one from the identity with v = 0 give every segment's transition and,
    with its true initial state, its outputs) → ``(y, final_state)`` equal to :func:`wkv.torch.rwkv7` of the whole
    sequence (to float32 rounding). B = 1; T a multiple of `segments`."""
    return _segmented("rwkv7", (r, w, k, v, a, b), (), state, segments, decay, context)


def rwkv6_segmented(r, w, k, v, u, state=None, *, segments: int, decay="exp_neg_exp", context=None):
    """:func:`rwkv7_segmented` for RWKV-6/5 (u is shared by every segment)."""
    return _segmented("rwkv6", (r, w, k, v), (u,), state, segments, decay, context)


def rwkv4_segmented(w, u, k, v, state=None, *, segments: int, context=None):
    """:func:`rwkv7_segmented` for RWKV-4 (k, v [1, T, C]; w, u shared; state [1, 3, C] planar)."""
    return _segmented("rwkv4", (k, v), (w, u), state, segments, None, context)


def _context_parallel(name, tokens, shared, state, group, decay, context):
    import torch.distributed as dist

    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    v = _values(name, tokens)
    empty = v.shape[1] == 0  # a rank without tokens passes the state on
    if empty:  # tied to the (empty) inputs, so that this rank's backward reaches the exchange too
        tr = _identity_transition(name, tokens) + 0.0 * sum(t.sum() for t in tokens)
    else:
        tr, runs = _transition(name, tokens, shared, decay, context)
    every = _AllGather.apply(tr, group, rank, world) if world > 1 else tr.unsqueeze(0)  # one exchange
    starts = _starts(name, state, [every[q] for q in range(rank + 1)], tokens)
    # every rank's loss must reach the exchange, so that every rank takes part in its backward
    # (rank 0's start does not depend on it): a zero-weight term does that
    start = starts[rank] + 0.0 * every.sum()
    if empty:
        return torch.zeros(v.shape, dtype=v.dtype, device=v.device) + 0.0 * start.sum(), start
    return _outputs(name, tokens, shared, start, tr, runs, decay, context)


def context_parallel_rwkv7(r, w, k, v, a, b, state=None, *, group=None, decay="clampw", context=None):
    """RWKV-7 over a sequence split across the ranks of `group` (torch.distributed, in rank
    order): each rank passes its own segment [B, L, H, N] (any L >= 0, the same B, H, N everywhere)
    → ``(y, segment_end_state)``: its segment's outputs and the true state at its segment's end
    (the last rank's is the sequence's final state). Every rank must call it with the same
    `state` (the sequence's initial state; None: zeros). Differentiable: the gradients of a
    rank's inputs include what the other ranks' losses send back through the exchange; a `state`
    that requires grad gets each rank's share (all_reduce them for the total)."""
    return _context_parallel("rwkv7", (r, w, k, v, a, b), (), state, group, decay, context)


def context_parallel_rwkv6(r, w, k, v, u, state=None, *, group=None, decay="exp_neg_exp", context=None):
    """:func:`context_parallel_rwkv7` for RWKV-6/5 (every rank passes the same u; its gradient
    on each rank is that rank's share)."""
    return _context_parallel("rwkv6", (r, w, k, v), (u,), state, group, decay, context)


def context_parallel_rwkv4(w, u, k, v, state=None, *, group=None, context=None):
    """:func:`context_parallel_rwkv7` for RWKV-4: each rank passes its segment k, v [B, L, C] and
    the same w, u (their gradients on each rank are that rank's share); the state is the
    planar [B, 3, C] (aa, bb, pp). The exchange is 4 C floats per batch row and rank."""
    return _context_parallel("rwkv4", (k, v), (w, u), state, group, None, context)


class _AllGather(torch.autograd.Function):
    """all_gather into [world, ...] whose backward is an all_reduce of the gradients (every
    backend has it, gloo included) and the rank's own slice."""

    @staticmethod
    def forward(ctx, x, group, rank, world):
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.group, ctx.rank = group, rank
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist

        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank], None, None, None
