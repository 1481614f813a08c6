"""``chute.mix``: weighted mixtures of datasets with exact proportions and weight schedules."""

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _chute
from ._errors import ConfigError
from ._loader import _as_list, _hf_arrow, _is_map_style, _transform

Weights = Union[Mapping[str, float], Sequence[float]]


def mix(
    components: Mapping[str, Any],
    weights: Union[Weights, Mapping[int, Weights], None] = None,
    *,
    ramp: bool = False,
    mode: str = "stratified",
    policy: Optional[str] = None,
    samples_per_epoch: Optional[int] = None,
    shuffle: Union[bool, str, Mapping[str, Union[bool, str]]] = True,
    seed: Optional[int] = None,
    seeds: Optional[Mapping[str, int]] = None,
    transforms: Optional[Mapping[str, Any]] = None,
    source_column: Optional[str] = None,
) -> _chute.Source:
    """A weighted mixture of datasets, usable wherever a source is (nested mixtures included).

        web = chute.dataset("web/*.bin", seq_len=1024)
        code = chute.dataset("code/*.bin", seq_len=1024)
        source = chute.mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3})
        loader = chute.Loader(source, batch_size=16)          # the mixture orders itself

    - ``components``: name -> chute source (``chute.dataset(...)``, another ``mix``), map-style
      dataset or Hugging Face dataset. Each runs through its own epochs: when one is exhausted
      it starts its next epoch, reshuffled, whatever the mixture's epoch.
    - ``weights``: name -> weight (normalized), or a schedule, position -> weights, by global
      sample position (``{0: {...}, 100_000: {...}}``; the first point at 0). A point holds
      until the next, or with ``ramp=True`` the weights move linearly between points (in up to
      64 steps). The schedule is part of the mixture, so a resumed run is on the same one.
      Default: equal weights.
    - ``mode``: ``"stratified"`` (default): every batch holds each component's share rounded
      down or up, with carry (over any run of batches from a schedule point, each count is
      within one sample of weight x samples); ``"random"``: components drawn i.i.d. by weight
      from the seeded RNG, as tf.data's ``sample_from_datasets``. Stratified batches are made
      for the loader's batch size: a ``state_dict`` resumes with the same one.
    - ``policy``: where the mixture's epoch ends: ``"stop_on_all"`` (default: when the last
      component finishes its first epoch), ``"stop_on_first"`` (the first), or ``"cycle"``
      with ``samples_per_epoch`` (giving ``samples_per_epoch`` alone means cycle).
    - ``shuffle``: each component's order in each of its epochs (``True``/``"global"``,
      ``False``/``"none"``, ``"block"``), one for all or a dict by name. The loader's own
      ``shuffle`` stays off: the mixture orders its samples.
    - ``seed``: the mixture's seed (default: the loader's); ``seeds``: a component's own.
    - ``transforms``: name -> transforms (as the loader takes them) run on that component's
      samples; afterwards every component must deliver the same fields.
    - ``source_column``: adds an int64 column with each sample's component index (the order
      of ``components``).

    ``loader.stats()["source"]["components"]`` counts the samples (and tokens) served per
    component against the target share; ``source.mixture`` describes the mixture.

    A mixture places its samples by the plan of the loader reading it, so it serves one loader
    at a time: for a second loader, call ``chute.mix`` again with the same arguments (same
    definition, same fingerprint).
    """
    if not isinstance(components, Mapping) or not components:
        raise ConfigError("invalid components: a mixture takes a non-empty dict of name -> source")
    names = list(components)
    for n in names:
        if not isinstance(n, str):
            raise ConfigError(f"invalid components: names are strings, got {n!r}")
    schedule = _schedule(weights, names)
    parts: List[Tuple[str, _chute.Source, str, Optional[int], List[Any]]] = []
    for name in names:
        source = _as_source(name, components[name])
        order = _per(shuffle, name, "shuffle")
        if isinstance(order, bool):
            order = "global" if order else "none"
        if not isinstance(order, str):
            raise ConfigError(f"invalid shuffle for {name!r}: {order!r}")
        own_seed = None if seeds is None else seeds.get(name)
        specs = [_transform(t) for t in _as_list(_per(transforms or {}, name, "transforms"))]
        parts.append((name, source, order, own_seed, specs))
    unknown = [n for n in list(seeds or {}) + list(transforms or {}) if n not in components]
    if unknown:
        raise ConfigError(f"invalid seeds/transforms: no component named {unknown[0]!r}")
    return _chute.mix(
        parts,
        schedule,
        ramp=ramp,
        mode=mode,
        policy=policy,
        samples_per_epoch=samples_per_epoch,
        seed=seed,
        source_column=source_column,
    )


def _per(value: Any, name: str, option: str) -> Any:
    """``value`` for component ``name``: one for all, or a dict by name."""
    if isinstance(value, Mapping):
        if option == "shuffle":
            return value.get(name, True)
        return value.get(name)
    return value


def _as_source(name: str, obj: Any) -> _chute.Source:
    if isinstance(obj, _chute.Source):
        return obj
    hf = _hf_arrow(obj)
    if hf is not None:
        return hf
    if _is_map_style(obj):
        return _chute.map_dataset(obj, None, 0)
    raise TypeError(
        f"component {name!r} must be a chute source, a map-style dataset or a Hugging Face "
        f"dataset, got {type(obj).__name__}"
    )


def _schedule(weights: Any, names: List[str]) -> List[Tuple[int, List[float]]]:
    """``weights`` as ``[(position, [weight per component])]``."""
    if weights is None:
        return [(0, [1.0] * len(names))]
    if isinstance(weights, Mapping) and weights and all(
        isinstance(k, int) and not isinstance(k, bool) for k in weights
    ):
        return [(int(p), _one(w, names, p)) for p, w in sorted(weights.items())]
    return [(0, _one(weights, names, 0))]


def _one(w: Any, names: List[str], at: int) -> List[float]:
    if isinstance(w, Mapping):
        unknown = [k for k in w if k not in names]
        if unknown:
            raise ConfigError(f"invalid weights: no component named {unknown[0]!r}")
        missing = [n for n in names if n not in w]
        if missing:
            raise ConfigError(
                f"invalid weights: no weight for {missing[0]!r} at position {at} (give 0 to "
                "leave it out there)"
            )
        return [float(w[n]) for n in names]
    values: Dict[int, float] = dict(enumerate(float(x) for x in w))
    if len(values) != len(names):
        raise ConfigError(
            f"invalid weights: {len(values)} weights at position {at} for {len(names)} components"
        )
    return [values[i] for i in range(len(names))]
