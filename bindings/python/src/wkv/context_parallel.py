"""Context parallelism: one long sequence split into segments that run at the same time, on
several processes (``torch.distributed``) or as the batch of one call, stitched together by
composing each segment's state transition.

RWKV-7's state update is affine in the state: S_t = S_{t-1} M_t + v_t k_t^T with
M_t = diag(w_t) + a_t b_t^T (acting on the key axis). So a segment maps its initial state S to
S A + B, where A = M_1 ... M_L (N x N per head) and B is the segment's final state from zero.
Both come from libwkv's own op: B by running the segment from a zero state, A by running it
from the identity with v = 0. Transitions compose associatively,
(A1, B1) then (A2, B2) = (A1 A2, B1 A2 + B2), so every segment's true initial state follows
from the transitions of the segments before it (an exchange of H N^2 floats per segment), and
each segment then runs once more from its true initial state for its outputs. Cost: about three
forwards of the segment (B, A, the final run) and the exchange, against one forward of the
whole sequence on one worker: it pays only with several workers and segments long against N.
The backward is composed in reverse the same way (_Chain): the gradient at a segment's start is
the part from its own outputs (one backward with no end-state gradient) plus the gradient at
its end carried back through A^T, so after one exchange of those parts every segment runs its
backward once more with its true end-state gradient: two backwards per segment, not the three
that autograd through the forward's three runs would take.

RWKV-6/5 have the same form with a diagonal A (the per-column product of the decays; u only
touches y). RWKV-4's state is the log-space triple (aa, bb, pp) (true numerator aa e^pp,
denominator bb e^pp): in linear space each channel decays by e^wd per token (wd = -exp(w), one
value per channel, time-invariant), so a segment of L tokens maps a start (aa0, bb0, pp0) to
its zero-start end (aaS, bbS, ppS) plus the start decayed by e^(L wd); this module applies that
in log space (p = max(pp0 + L wd, ppS), every exponent <= 0), so its transition is
(aaS, bbS, ppS, L wd) per channel: C floats, not N^2.
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
    """A segment's transition as one tensor: RWKV-7/6 stack([A, B]) [2, B, H, N, N], A from the
    identity with v = 0 and B from zeros; RWKV-4 [B, 4, C]: its zero-start end (aa, bb, pp) and
    L wd."""
    v = _values(name, tokens)
    if name == "rwkv4":
        Bsz, L, C = v.shape
        _, end = _run(name, tokens, shared, None, decay, context)
        ld = (-torch.exp(shared[0].float()) * L).expand(Bsz, 1, C)
        return torch.cat([end, ld], 1)
    Bsz, _, H, N = v.shape
    _, Bst = _run(name, tokens, shared, _zero_state(name, tokens), decay, context)
    no_v = list(tokens)
    no_v[3] = torch.zeros_like(v)
    _, A = _run(name, no_v, shared, _identity(Bsz, H, N, v), decay, context)
    return torch.stack([A, Bst])


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
    tr = _transition("rwkv7", (r, w, k, v, a, b), (), decay, context)
    return tr[0], tr[1]


def segment_transition_rwkv6(r, w, k, v, u, *, decay="exp_neg_exp", context=None):
    """RWKV-6/5's (A, B): A is diagonal (the product of the segment's decays per key column),
    returned as the full matrix."""
    tr = _transition("rwkv6", (r, w, k, v), (u,), decay, context)
    return tr[0], tr[1]


def segment_transition_rwkv4(w, u, k, v, *, context=None) -> torch.Tensor:
    """RWKV-4's transition of a segment k, v [B, L, C]: [B, 4, C] float32, its final state from
    the zero state (aa, bb, pp) and L wd (wd = -exp(w)), what :func:`compose_rwkv4` combines."""
    return _transition("rwkv4", (k, v), (w, u), None, context)


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


def _pull_back(name, start: torch.Tensor, tr: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """h (the gradient at a segment's end state) carried to its start through the transition:
    h A^T for RWKV-7/6, the log-space map's vector-Jacobian product for RWKV-4. The op maps a
    start to exactly what _apply gives (RWKV-4 included: its running max is max(pp0 + L wd, ppS)),
    so this is the op's own state Jacobian."""
    if name != "rwkv4":
        return h @ tr[0].transpose(-1, -2)
    with torch.enable_grad():
        s = start.detach().requires_grad_()
        (g,) = torch.autograd.grad(_apply(name, s, tr), s, h)
    return g


def _op_backward(name, tokens, shared, start, dy, dend, decay, context):
    """The op's backward of a segment (or a batch of them) run from `start`: the gradients of the
    token inputs, of the shared ones and of start."""
    from . import ops
    from . import torch as wt

    spec = ops.SPECS[name]
    inputs = (*shared, *tokens) if name == "rwkv4" else (*tokens, *shared)
    g = wt._bwd(spec, inputs, start, None, dy, dend, ops.decay_code("wkv.context_parallel", decay or spec.default_decay), 0, context)
    n = len(spec.inputs)
    ordered, dstart = g[:n], g[n]
    if name == "rwkv4":
        return ordered[len(shared):], ordered[:len(shared)], dstart
    return ordered[:len(tokens)], ordered[len(tokens):], dstart


class _Chain(torch.autograd.Function):
    """P segments from their true initial states, with the backward composed in reverse.

    Forward: each segment's transition (from the op: zeros, and the identity with v = 0), the
    exchange, every segment's true start, one run of the segment(s) this caller holds.
    Backward: the loss reaches a segment's start through its outputs and through its end state,
    and the op's backward is linear in (dy, d end): d start_q = c_q + J_q^T h_q, where
    c_q = the backward from dy_q alone, h_q = d end_q (the caller's) + d start_(q+1), and J_q^T
    is _pull_back. So: one backward per segment with d end = 0 for c_q (skipped for the first,
    whose c nobody needs), the exchange of (c_q, d end_q), the scan from the last segment down
    (H N^2 work per segment), and one backward per segment with its true h_q for the gradients of
    its inputs. Two backwards per segment, where autograd through the forward's three runs takes
    three.

    `where` says where the segments are: ("batch", P) — the batch of one call holds them (B = 1
    sequence, one device) — or ("ranks", group, rank, world) — one segment per rank."""

    @staticmethod
    def forward(ctx, name, decay, context, where, n_tokens, state, *tensors):
        tokens, shared = tensors[:n_tokens], tensors[n_tokens:]
        empty = _values(name, tokens).shape[1] == 0  # a rank without tokens passes the state on
        tr = _identity_transition(name, tokens) if empty else _transition(name, tokens, shared, decay, context)
        trs = _gather(where, tr, 0 if name == "rwkv4" else 1)
        one = [x[:1] for x in tokens]  # a segment's shape, for the zero state
        starts = _starts(name, state, trs, one)
        mine = torch.cat(starts, 0) if where[0] == "batch" else starts[where[2]]
        if empty:
            y, end = torch.zeros(_values(name, tokens).shape, dtype=_values(name, tokens).dtype,
                                 device=_values(name, tokens).device), mine
        else:
            y, end = _run(name, tokens, shared, mine, decay, context)
        ctx.wkv = (name, decay, context, where, n_tokens, state is not None, empty)
        ctx.save_for_backward(mine, torch.stack(starts), torch.stack(trs), *tensors)
        if where[0] == "batch":  # the sequence's final state: the last segment's end
            end = end[-1:]
        return y, end

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, dend):
        name, decay, context, where, n_tokens, has_state, empty = ctx.wkv
        mine, starts, trs, *tensors = ctx.saved_tensors
        tokens, shared = tensors[:n_tokens], tensors[n_tokens:]
        v = _values(name, tokens)
        if dy is None:
            dy = torch.zeros_like(v)
        P = starts.shape[0]
        # the caller's d end per segment: in a batch only the last segment's end is an output
        if where[0] == "batch":
            d_end = torch.zeros_like(mine)
            if dend is not None:
                d_end[-1:] = dend
        else:
            d_end = dend if dend is not None else torch.zeros_like(mine)
        first = where[0] == "ranks" and where[2] == 0
        if empty or first:
            c = torch.zeros_like(mine)
        else:
            c = _op_backward(name, tokens, shared, mine, dy, torch.zeros_like(mine), decay, context)[2]
        cs = _gather(where, torch.stack([c, d_end]), 1)
        hs = [None] * P
        h = cs[P - 1][1]
        for q in range(P - 1, -1, -1):
            hs[q] = h
            if q:
                h = cs[q - 1][1] + cs[q][0] + _pull_back(name, starts[q], trs[q], h)
        h_mine = torch.cat(hs, 0) if where[0] == "batch" else hs[where[2]]
        if empty:
            g_tok = [torch.zeros_like(t) for t in tokens]
            g_sh = [torch.zeros_like(t) for t in shared]
            g_start = h_mine
        else:
            g_tok, g_sh, g_start = _op_backward(name, tokens, shared, mine, dy, h_mine, decay, context)
        g_state = None
        if has_state:  # the initial state is segment 0's start: its gradient lives with segment 0
            if where[0] == "batch":
                g_state = g_start[:1]
            else:
                g_state = g_start if where[2] == 0 else torch.zeros_like(g_start)
        return (None, None, None, None, None, g_state, *g_tok, *g_sh)


def _gather(where, x: torch.Tensor, axis: int) -> List[torch.Tensor]:
    """Every segment's x, in order: in a batch, its rows along `axis` (x's batch axis), or one x
    per rank by all_gather."""
    if where[0] == "batch":
        return [x.narrow(axis, i, 1) for i in range(where[1])]
    import torch.distributed as dist

    group, world = where[1], where[3]
    if world == 1:
        return [x]
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return parts


def _segmented(name, tokens, shared, state, segments, decay, context):
    Bsz, T = _values(name, tokens).shape[:2]
    if Bsz != 1 or segments < 1 or T % segments:
        raise ValueError("%s_segmented: needs B = 1 and T (%d) a multiple of segments (%d)" % (name, T, segments))
    P, L = segments, T // segments
    seg = [x.reshape(P, L, *x.shape[2:]) for x in tokens]  # the segments as a batch
    y, s_end = _Chain.apply(name, decay, _resolved(context), ("batch", P), len(seg), state, *seg, *shared)
    return y.reshape(1, T, *y.shape[2:]), s_end


def _resolved(context):
    """The context every call of one chain uses (the backward may run on another thread)."""
    if context is not None:
        return context
    from .context import current_context

    return current_context()


def rwkv7_segmented(r, w, k, v, a, b, state=None, *, segments: int, decay="clampw", context=None):
    """One device, T split into `segments` segments that run as the batch of each call (their
    transitions in one call from zeros and one from the identity, then every segment from its
    true initial state) → ``(y, final_state)`` equal to :func:`wkv.torch.rwkv7` of the whole
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

    where = ("ranks", group, dist.get_rank(group), dist.get_world_size(group))
    return _Chain.apply(name, decay, _resolved(context), where, len(tokens), state, *tokens, *shared)


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
