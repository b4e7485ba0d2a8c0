"""Steering vectors and sparse autoencoders at a site: small `fn(value, site)`s for `interventions=`.

`steer(vector, positions=None, scale=1.0)` adds `scale * vector` to the value at every position, or
only at `positions` (an int, a list or a slice of the position axis, `axis=1` by default: a
`[batch, position, hidden]` residual). `{"call=model.layers.2": steer(v)}` steers the residual stream
after layer 2, exactly as a forward hook on that layer adding `v` would.

`attach(sae, keep_error=True)` runs a sparse autoencoder or transcoder at the site: `sae` is a module
(or any object) with `encode` and `decode`, or a callable returning `(features, reconstruction)`.
Its features of each site are kept in `.features` (`{"path:var": [tensor per occurrence]}`, those
of the last run), and are a captured variable of the site's block, `<var>.features` (`Site.record`):
`capture_run` keeps them as a step right after the site's (`keep="model:hidden_states.features"`),
`capture_dataset` writes them like any variable. Without `keep_error` the value is replaced by the reconstruction. With
`keep_error=True` the run's outputs stay `torch.equal` to the model's without the SAE: the value is
`x.detach() + (reconstruction - reconstruction.detach())`, which is `x` bit for bit (adding an
exact zero), while autograd sees reconstruction + a constant error term, the usual error node: a
gradient reaches the features (and the model before the site through the SAE's encoder), not `x`
directly. A reconstruction that is not finite would not add an exact zero, so it is refused.

Depends on torch and traces.interventions (the `Site` it is called with).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .interventions import InterventionError, Site

__all__ = ["steer", "attach", "SAEAttachment"]


def steer(vector: torch.Tensor, positions: Any = None, scale: float = 1.0, axis: int = 1):
    """`fn(value, site)` adding `scale * vector` to the value, at every position or at `positions` on `axis`."""
    if not isinstance(vector, torch.Tensor):
        raise InterventionError(f"steer needs a tensor vector, got {type(vector).__name__}")
    added = vector * scale if scale != 1.0 else vector

    def add(value: torch.Tensor, site: Site) -> torch.Tensor:
        if positions is None:
            return value + added
        index = (slice(None),) * axis + (positions,)
        new = value.clone()
        new[index] = value[index] + added
        return new

    return add


class SAEAttachment:
    """An SAE or transcoder at a site, as `fn(value, site)` of `interventions=` (see `attach`)."""

    def __init__(self, sae: Any, keep_error: bool = True):
        if not (hasattr(sae, "encode") and hasattr(sae, "decode")) and not callable(sae):
            raise InterventionError("attach needs a module with encode and decode, or a callable returning "
                                    f"(features, reconstruction); got {type(sae).__name__}")
        self.sae = sae
        self.keep_error = keep_error
        self.features: dict[str, list[torch.Tensor]] = {}
        self._run: Optional[Any] = None

    def __call__(self, value: torch.Tensor, site: Site) -> torch.Tensor:
        if site.run is not self._run:  # a new run: the features of the last one only
            self._run, self.features = site.run, {}
        if hasattr(self.sae, "encode") and hasattr(self.sae, "decode"):
            features = self.sae.encode(value)
            reconstruction = self.sae.decode(features)
        else:
            features, reconstruction = self.sae(value)
        self.features.setdefault(site.name, []).append(features)
        site.record(f"{site.var}.features", features, f"Features of the SAE attached at {site.name}",
                    f"{type(self.sae).__name__}.encode")
        if not isinstance(reconstruction, torch.Tensor) or reconstruction.shape != value.shape:
            raise InterventionError(f"the SAE at {site.name} reconstructs shape "
                                    f"{tuple(getattr(reconstruction, 'shape', ()))}; the value has {tuple(value.shape)}")
        reconstruction = reconstruction.to(value.dtype)
        if not self.keep_error:
            return reconstruction
        if not torch.isfinite(reconstruction).all():
            raise InterventionError(f"the SAE's reconstruction at {site.name} is not finite: keep_error=True "
                                    "could not keep the outputs exact")
        return value.detach() + (reconstruction - reconstruction.detach())


def attach(sae: Any, keep_error: bool = True) -> SAEAttachment:
    """An `SAEAttachment`: `sae` run at the site, its features kept, outputs exact with `keep_error=True`."""
    return SAEAttachment(sae, keep_error)
