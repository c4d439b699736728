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
Gradients flow through every step by autograd (the op's backward gives the state gradient;
the exchange is an all_gather whose backward all-reduces the gradients).

RWKV-6/5 have the same form with a diagonal A (the per-column product of the decays; u only
touches y); RWKV-4's log-space state is not done here.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

__all__ = ["segment_transition_rwkv7", "segment_transition_rwkv6", "compose", "rwkv7_segmented",
           "rwkv6_segmented", "context_parallel_rwkv7", "context_parallel_rwkv6"]


def _op(name: str = "rwkv7"):
    from . import torch as wt

    return getattr(wt, name)


# The ops this module splits: name, the per-token inputs, the shared ones (not split along T).
_OPS = {"rwkv7": (("r", "w", "k", "v", "a", "b"), ()), "rwkv6": (("r", "w", "k", "v"), ("u",))}


def _transition(name, tokens, shared, decay, context):
    """(A, B) of a segment: its final state from zero (B) and from the identity with v = 0 (A)."""
    v = tokens[3]
    Bsz, _, H, N = v.shape
    op = _op(name)
    zeros = torch.zeros(Bsz, H, N, N, dtype=torch.float32, device=v.device)
    _, Bst = op(*tokens, *shared, zeros, decay=decay, context=context)
    no_v = list(tokens)
    no_v[3] = torch.zeros_like(v)
    _, A = op(*no_v, *shared, _identity(Bsz, H, N, v), decay=decay, context=context)
    return A, Bst


def _identity(B: int, H: int, N: int, like: torch.Tensor) -> torch.Tensor:
    return torch.eye(N, dtype=torch.float32, device=like.device).expand(B, H, N, N).contiguous()


def segment_transition_rwkv7(r, w, k, v, a, b, *, decay="clampw", context=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(A, B) of a segment [B, L, H, N]: its final state is S A + B for an initial state S
    (A, B: [B, H, N, N] float32; S A multiplies S's key axis by A)."""
    return _transition("rwkv7", (r, w, k, v, a, b), (), decay, context)


def segment_transition_rwkv6(r, w, k, v, u, *, decay="exp_neg_exp", context=None):
    """RWKV-6/5's (A, B): A is diagonal (the product of the segment's decays per key column),
    returned as the full matrix."""
    return _transition("rwkv6", (r, w, k, v), (u,), decay, context)


def compose(first: Tuple[torch.Tensor, torch.Tensor], then: Tuple[torch.Tensor, torch.Tensor]):
    """The transition of `first` followed by `then`: (A1 A2, B1 A2 + B2)."""
    (A1, B1), (A2, B2) = first, then
    return A1 @ A2, B1 @ A2 + B2


def _starts(state: Optional[torch.Tensor], transitions: Sequence[Tuple[torch.Tensor, torch.Tensor]],
            shape: Tuple[int, int, int, int], like: torch.Tensor) -> List[torch.Tensor]:
    """The true initial state of every segment, from the initial state and the transitions."""
    s = state if state is not None else torch.zeros(shape, dtype=torch.float32, device=like.device)
    out = []
    for A, Bst in transitions:
        out.append(s)
        s = s @ A + Bst
    return out


def _segmented(name, tokens, shared, state, segments, decay, context):
    Bsz, T, H, N = tokens[3].shape
    if Bsz != 1 or segments < 1 or T % segments:
        raise ValueError("%s_segmented: needs B = 1 and T (%d) a multiple of segments (%d)" % (name, T, segments))
    P, L = segments, T // segments
    seg = [x.reshape(P, L, H, N) for x in tokens]  # the segments as a batch
    A, Bst = _transition(name, seg, shared, decay, context)
    starts = _starts(state, [(A[i:i + 1], Bst[i:i + 1]) for i in range(P)], (1, H, N, N), tokens[3])
    y, s_end = _op(name)(*seg, *shared, torch.cat(starts, 0), decay=decay, context=context)
    return y.reshape(1, T, H, N), s_end[P - 1:P]


def rwkv7_segmented(r, w, k, v, a, b, state=None, *, segments: int, decay="clampw", context=None):
    """One device, T split into `segments` segments that run as the batch of each call (their
    transitions in one call from zeros and one from the identity, then every segment from its
    true initial state) → ``(y, final_state)`` equal to :func:`wkv.torch.rwkv7` of the whole
    sequence (to float32 rounding). B = 1; T a multiple of `segments`."""
    return _segmented("rwkv7", (r, w, k, v, a, b), (), state, segments, decay, context)


def rwkv6_segmented(r, w, k, v, u, state=None, *, segments: int, decay="exp_neg_exp", context=None):
    """:func:`rwkv7_segmented` for RWKV-6/5 (u is shared by every segment)."""
    return _segmented("rwkv6", (r, w, k, v), (u,), state, segments, decay, context)


def _context_parallel(name, tokens, shared, state, group, decay, context):
    import torch.distributed as dist

    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    Bsz, _, H, N = tokens[3].shape
    A, Bst = _transition(name, tokens, shared, decay, context)
    both = torch.stack([A, Bst])  # one exchange for both halves of the transition
    every = _AllGather.apply(both, group, rank, world) if world > 1 else both.unsqueeze(0)
    starts = _starts(state, [(every[q, 0], every[q, 1]) for q in range(rank + 1)], (Bsz, H, N, N), tokens[3])
    # every rank's loss must reach the exchange, so that every rank takes part in its backward
    # (rank 0's start does not depend on it): a zero-weight term does that
    start = starts[rank] + 0.0 * every.sum()
    return _op(name)(*tokens, *shared, start, decay=decay, context=context)


def context_parallel_rwkv7(r, w, k, v, a, b, state=None, *, group=None, decay="clampw", context=None):
    """RWKV-7 over a sequence split across the ranks of `group` (torch.distributed, in rank
    order): each rank passes its own segment [B, L, H, N] (any L, the same B, H, N everywhere)
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
