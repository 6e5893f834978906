"""The search of ``boundary-distance``: the distance from each ξ to the nearest decision boundary.

:func:`nearest_boundary` marches outward along seeded directions (biased towards the
linearised tie planes of the nearest classes), bisects the first sign change of the
:func:`margin`, and refines the closest crossing by projected gradient steps (the method
is :mod:`ckpt.analyzers.boundary_distance`'s docstring). Torch on the read-out's logits
as a function of ξ; no store.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

FOUND, NO_BOUNDARY, NOT_FINITE = 0, 1, 2
"""``status`` values."""
MARCH = 64
"""Radii sampled along each direction before bisection: r_m = radius · (m / MARCH)²."""
REFINE = 40
"""Projected-gradient iterations of the local refinement, at most."""
LOCAL = 16
"""Radii sampled along a candidate direction of the refinement, up to the current distance."""
MAX_TIE_PLANES = 64
"""Above this many other classes, only the runner-up's linearised tie plane gives a direction."""


def margin(logits: Any, predicted: Any) -> Any:
    """The margin g: logit of the predicted class − the largest other logit, ``[B, K]`` of ``[B, K, C]`` and ``[B]``."""
    import torch

    index = predicted[:, None, None].expand(-1, logits.shape[1], 1)
    top = torch.gather(logits, -1, index)[..., 0]
    others = logits.scatter(-1, index, float("-inf"))
    return top - others.amax(-1)


def _directions(towards: Any, count: int, seed: int) -> Any:
    """``[B, K, d]`` unit directions: ``towards`` ``[B, J, d]``, then angles (d = 2) or axes and random ones.

    At d = 2, ``count`` evenly spaced angles besides ``towards``; above, the axes both ways
    and seeded random directions, ``count`` in all.
    """
    import torch

    rows, _, d = towards.shape
    dtype, device = towards.dtype, towards.device
    if d == 2:
        angles = torch.arange(count, dtype=dtype, device=device) * (2 * math.pi / count)
        return torch.cat([towards, torch.stack([angles.cos(), angles.sin()], -1).expand(rows, count, 2)], 1)
    eye = torch.eye(d, dtype=dtype, device=device)
    fixed = torch.cat([eye, -eye]).expand(rows, 2 * d, d)
    extra = max(0, count - 2 * d - towards.shape[1])
    generator = torch.Generator().manual_seed(seed)
    random = torch.randn(extra, d, generator=generator, dtype=torch.float64).to(dtype=dtype, device=device)
    random = (random / random.norm(dim=-1, keepdim=True)).expand(rows, extra, d)
    return torch.cat([towards, fixed, random], 1)


def _towards_tie_planes(logits_fn: Callable[[Any], Any], xi: Any, predicted: Any) -> Any:
    """``[B, J, d]``: from ξ towards the nearest point of each linearised tie plane logit_c = logit_j.

    With l_cj = logit_c − logit_j and its gradient a_cj at ξ, the plane l_cj + a_cj·(x − ξ) = 0
    is nearest along −a_cj. For a linear read-out the nearest boundary point lies along one of
    them exactly (its class region is the intersection of these half-spaces). The J =
    min(C − 1, MAX_TIE_PLANES) classes with the nearest planes, one backward pass per class.
    """
    import torch

    base = xi.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        logits = logits_fn(base[:, None])[:, 0]
        classes = logits.shape[-1]
        if classes > MAX_TIE_PLANES + 1:
            # too many classes for a gradient each: the runner-up's plane only (that of g itself)
            (gradient,) = torch.autograd.grad(margin(logits[:, None], predicted)[:, 0].sum(), base)
            return (-gradient / gradient.norm(dim=-1, keepdim=True).clamp_min(1e-300))[:, None]
        rows = [torch.autograd.grad(logits[:, j].sum(), base, retain_graph=j + 1 < classes)[0] for j in range(classes)]
    jacobian = torch.stack(rows, 1).detach()  # [B, C, d]
    logits = logits.detach()
    top = jacobian.gather(1, predicted[:, None, None].expand(-1, 1, jacobian.shape[-1]))
    normals = top - jacobian  # a_cj, zero at j = c
    size = normals.norm(dim=-1)
    gaps = logits.gather(1, predicted[:, None]) - logits
    plane = torch.where(size > 0, gaps / size.clamp_min(1e-300), math.inf)
    plane.scatter_(1, predicted[:, None], math.inf)
    nearest = plane.argsort(-1)[:, : classes - 1]
    chosen = normals.gather(1, nearest[..., None].expand(-1, -1, normals.shape[-1]))
    return -chosen / chosen.norm(dim=-1, keepdim=True).clamp_min(1e-300)


def _bisect(g_of: Callable[[Any], Any], low: Any, high: Any, tol: float) -> Any:
    """Shrink brackets [low, high] (g > 0 at low, g <= 0 at high) to width ``tol``; returns the new highs."""
    import torch

    width = float((high - low).max()) if high.numel() else 0.0
    for _ in range(max(0, math.ceil(math.log2(max(width, tol) / tol)))):
        middle = (low + high) / 2
        outside = g_of(middle) <= 0
        high = torch.where(outside, middle, high)
        low = torch.where(outside, low, middle)
    return high


def nearest_boundary(
    logits_fn: Callable[[Any], Any],
    xi: Any,
    *,
    directions: int,
    radius: float,
    tol: float,
    seed: int = 0,
) -> tuple[Any, Any, Any, Any]:
    """Distance from each ξ to the nearest zero of g, the read-out's decision boundary (see the module docstring).

    Parameters
    ----------
    logits_fn
        ``points [B, K, d] -> logits [B, K, C]``, row b belonging to ξ_b (:func:`readout_logits`).
    xi
        ``[B, d]`` sequence embeddings (floating point).
    directions, radius, tol, seed
        ``--directions``, ``--radius``, ``--tol`` and the seed of the random directions (d > 2).

    Returns
    -------
    tuple
        ``(distance [B], status [B], predicted [B], margin [B])``; distance NaN unless status is FOUND.
    """
    import torch

    rows, d = xi.shape
    with torch.no_grad():
        logits = logits_fn(xi[:, None])[:, 0]
    predicted = logits.argmax(-1)
    finite = torch.isfinite(logits).all(-1)
    g0 = margin(logits[:, None], predicted)[:, 0]
    units = _directions(_towards_tie_planes(logits_fn, xi, predicted), directions, seed)

    def g_along(u: Any, r: Any) -> Any:  # u [B, K, d], r [B, K]
        with torch.no_grad():
            return margin(logits_fn(xi[:, None] + r[..., None] * u), predicted)

    # 2. march outward on r_m = radius (m / MARCH)², keeping each direction's first sign change
    k = units.shape[1]
    low = torch.zeros(rows, k, dtype=xi.dtype, device=xi.device)
    high = torch.full_like(low, math.inf)
    previous = low
    for m in range(1, MARCH + 1):
        r = torch.full_like(low, radius * (m / MARCH) ** 2)
        crossed = (g_along(units, r) <= 0) & torch.isinf(high)
        low = torch.where(crossed, previous, low)
        high = torch.where(crossed, r, high)
        previous = r
    found = torch.isfinite(high)
    safe_high = torch.where(found, high, low)
    high = torch.where(found, _bisect(lambda r: g_along(units, r), low, safe_high, tol), high)
    best = high.argmin(-1)
    distance = high.gather(-1, best[:, None])[:, 0]
    u = units[torch.arange(rows), best]

    # 3. projected-gradient refinement of the best direction (one per example)
    step = torch.full_like(distance, (2 * math.pi / directions) if d == 2 else 0.25)
    active = torch.isfinite(distance) & (distance > 0) & finite
    for _ in range(REFINE):
        active = active & (distance * step >= tol)
        if not active.any():
            break
        point = (xi + torch.where(active, distance, 0)[:, None] * u).detach().requires_grad_(True)
        with torch.enable_grad():
            (normal,) = torch.autograd.grad(margin(logits_fn(point[:, None]), predicted)[:, 0].sum(), point)
        along = (normal * u).sum(-1)
        tangent = normal - along[:, None] * u
        size = tangent.norm(dim=-1)
        # stationary (∇g parallel to x − ξ) or a tangential crossing: nothing to descend along
        active = active & (along < 0) & (size > 1e-12 * normal.norm(dim=-1))
        turn = -tangent / size.clamp_min(1e-300)[:, None]
        candidate = u * step.cos()[:, None] + turn * step.sin()[:, None]
        candidate = candidate / candidate.norm(dim=-1, keepdim=True)
        radii = (
            torch.where(active, distance, 0)[:, None]
            * torch.arange(1, LOCAL + 1, dtype=xi.dtype, device=xi.device)
            / LOCAL
        )
        values = g_along(candidate[:, None].expand(-1, LOCAL, -1), radii)
        crossed = values <= 0
        first = torch.where(crossed.any(-1), crossed.float().argmax(-1), LOCAL)
        hit = active & (first < LOCAL)
        index = first.clamp(max=LOCAL - 1)[:, None]
        top = radii.gather(-1, index)[:, 0]
        bottom = torch.where(index[:, 0] > 0, radii.gather(-1, (index - 1).clamp_min(0))[:, 0], 0)
        refined = _bisect(
            lambda r, candidate=candidate: g_along(candidate[:, None], r[:, None])[:, 0], bottom, top, tol
        )
        better = hit & (refined < distance)
        distance = torch.where(better, refined, distance)
        u = torch.where(better[:, None], candidate, u)
        step = torch.where(better, (2 * step).clamp(max=math.pi / 2), step / 2)

    status = torch.full((rows,), FOUND, dtype=torch.int8)
    status[~torch.isfinite(distance).cpu()] = NO_BOUNDARY
    status[~finite.cpu()] = NOT_FINITE
    tie = finite & (g0 <= 0)  # ξ on a boundary already
    distance = torch.where(tie, 0, distance)
    status[tie.cpu()] = FOUND
    distance = torch.where(torch.as_tensor(status == FOUND, device=distance.device), distance, math.nan)
    return distance, status, predicted, g0
