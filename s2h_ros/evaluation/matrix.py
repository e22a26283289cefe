"""The evaluation matrix (``s2h eval --dataset matrix``): held-out sensors x scene families,
mixed-sensor pairs and the bundled real pairs, every method on the same pairs in one run.

Cells:

- **sensor cells**: one lidar preset in one outdoor scene family, pairs 10-20 m apart
  (``synthetic_pairs``), each source turned about z by a random heading (default 0-180 deg
  either way, so any relative heading);
- **indoor cells**: a depth camera (or an indoor lidar) in rooms / offices / a warehouse, pairs
  1-3 m apart whose overlap (the smaller of :func:`overlap_fractions`) lies in 30-60 %, at
  3DMatch thresholds and 0.05 m voxels, turned like the outdoor ones;
- **mixed cells**: source from one sensor, target from another, same world, drive and poses
  (``synthetic_pairs(target_sensor=...)``);
- **real cells**: the bundled KITTI loop pair and 3DMatch demo pair, as they are (not turned).

Every synthetic pair records its ``overlap`` (the smaller of its two overlap fractions) and its
``shared_view`` (the larger). Two narrow views 10-20 m apart may look apart (Livox scans of a
street before and after a corner: shared view 0.00-0.02 where every registrable pair of the
development matrices had 0.13 or more); such a pair (``shared_view`` below
``PairSettings.min_shared_view``) cannot be registered from its points by any method. It stays in
the cell, where only a refusal is right, and the summary gives the recall over the pairs with a
shared view beside the recall over all of them.

Every synthetic cell has its own world seed in 0-999 (the range no training run may use),
derived from the base seed and the cell's key (:func:`cell_seed`) and distinct within a matrix.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from s2h_ros.datasets.types import overlap_fractions
from s2h_ros.evaluation.metrics import THRESHOLDS, RecallThreshold

HELD_OUT_SEEDS = 1000  # seeds 0..999: evaluation worlds only (training refuses them)
OUTDOOR_SENSORS = ("vlp16", "hdl32", "os1_64", "os1_128", "livox")
OUTDOOR_FAMILIES = ("town", "suburban", "highway", "parking_lot", "open_field", "tunnel")
INDOOR_SENSORS = ("depth_camera",)
INDOOR_FAMILIES = ("rooms", "office", "warehouse")
MIXED = ("vlp16:os1_128", "os1_128:vlp16", "hdl32:livox")
MIXED_FAMILIES = ("town", "suburban")
REAL = ("kitti-loop", "3dmatch-demo")
REAL_SCALE = {"kitti-loop": "outdoor", "3dmatch-demo": "indoor"}
# Scenes whose geometry leaves a direction free (issue 15: they "may be lower", and must not be
# trusted wrong): the totals count them apart from the other outdoor cells.
DEGENERATE_FAMILIES = ("open_field", "tunnel")
GROUPS = ("outdoor", "outdoor, degenerate", "mixed", "indoor", "real", "all")
SCALE_THRESHOLD = {"outdoor": THRESHOLDS["kitti"], "indoor": THRESHOLDS["3dmatch"]}
SCALE_VOXEL = {"outdoor": 0.3, "indoor": 0.05}


@dataclass
class Cell:
    """One row of the matrix."""

    key: str  # "vlp16/town", "vlp16>os1_128/town", "real/kitti-loop"
    kind: str  # "sensor", "mixed" or "real"
    scale: str  # "outdoor" (KITTI thresholds, 0.3 m voxels) or "indoor" (3DMatch, 0.05 m)
    family: str | None = None
    sensor: str | None = None  # the source's sensor (synthetic)
    target_sensor: str | None = None  # the target's sensor (synthetic; the source's unless mixed)
    seed: int | None = None  # the held-out world (synthetic)
    dataset: str = "synthetic"  # or the real pair's dataset name
    seeds_tried: list[int] = field(default_factory=list)  # worlds whose drive was too short first

    @property
    def threshold(self) -> RecallThreshold:
        return SCALE_THRESHOLD[self.scale]

    @property
    def data(self) -> str:
        return "real" if self.kind == "real" else "held-out sim"


def cell_seed(base: int, key: str) -> int:
    """The held-out world seed (0-999) of the cell ``key`` in a matrix with base seed ``base``:
    a CRC-32 of both, so a cell keeps its world when other cells are added or removed."""
    return zlib.crc32(f"{int(base)}:{key}".encode()) % HELD_OUT_SEEDS


def _next_free(seed: int, taken: set[int]) -> int:
    if len(taken) >= HELD_OUT_SEEDS:
        raise ValueError("more cells than held-out seeds")
    while seed in taken:
        seed = (seed + 1) % HELD_OUT_SEEDS
    return seed


def parse_worlds(worlds: str | dict[str, int] | None) -> dict[str, int]:
    """``{cell key: world seed}`` from ``"KEY=SEED,..."`` (or a dict, checked); seeds are held-out
    worlds, 0 .. ``HELD_OUT_SEEDS`` - 1."""
    if isinstance(worlds, dict):
        items = [(str(k), str(v)) for k, v in worlds.items()]
    else:
        items = []
        for entry in _split(worlds):
            key, sep, seed = entry.rpartition("=")
            if not sep or not key.strip():
                raise ValueError(f"a world is CELL=SEED (e.g. depth_camera/rooms=5), got {entry!r}")
            items.append((key.strip(), seed.strip()))
    out: dict[str, int] = {}
    for key, seed in items:
        if not seed.isdigit() or not 0 <= int(seed) < HELD_OUT_SEEDS:
            raise ValueError(f"the world of {key} must be a held-out seed 0-{HELD_OUT_SEEDS - 1}, got {seed!r}")
        if key in out:
            raise ValueError(f"--worlds names {key} twice")
        out[key] = int(seed)
    return out


def _split(value: str | list[str] | tuple[str, ...] | None) -> list[str]:
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [v.strip() for v in items if v.strip()]


def matrix_cells(base_seed: int = 0, sensors=OUTDOOR_SENSORS, families=OUTDOOR_FAMILIES,
                 indoor_sensors=INDOOR_SENSORS, indoor_families=INDOOR_FAMILIES, mixed=MIXED,
                 mixed_families=MIXED_FAMILIES, real=REAL, worlds=None) -> list[Cell]:
    """The rows of a matrix: every sensor x outdoor family, indoor sensor x indoor family, mixed
    ``"SRC:TGT"`` sensor pair x mixed family, then the real pairs. Lists may be comma-separated
    strings. A seed that an earlier cell of the same matrix holds moves on to the next free one.
    ``worlds``: ``{cell key: world seed}`` (or ``"KEY=SEED,..."``, the key as in ``Cell.key``) for
    cells whose held-out world is named rather than drawn from ``base_seed``: a fresh world chosen
    among the seeds no earlier run used."""
    from s2h_ros.datasets.synthetic import FAMILIES, LIDAR_PRESETS

    def check(names: list[str], known, what: str) -> list[str]:
        bad = [n for n in names if n not in known]
        if bad:
            raise ValueError(f"unknown {what} {', '.join(bad)} (choose from {', '.join(known)})")
        return names

    def check_families(names: list[str], kind: str, what: str) -> list[str]:
        check(names, tuple(FAMILIES), what)
        wrong = [n for n in names if FAMILIES[n].kind != kind]
        if wrong:
            raise ValueError(f"{what} must be {kind} families; {', '.join(wrong)} are not")
        return names

    specs: list[Cell] = []
    for sensor in check(_split(sensors), LIDAR_PRESETS, "sensor"):
        for family in check_families(_split(families), "outdoor", "families"):
            specs.append(Cell(f"{sensor}/{family}", "sensor", "outdoor", family, sensor, sensor))
    for sensor in check(_split(indoor_sensors), LIDAR_PRESETS, "indoor sensor"):
        for family in check_families(_split(indoor_families), "indoor", "indoor families"):
            specs.append(Cell(f"{sensor}/{family}", "sensor", "indoor", family, sensor, sensor))
    for spec in _split(mixed):
        src, sep, tgt = spec.partition(":")
        if not sep or not src or not tgt or src == tgt:
            raise ValueError(f"a mixed pair is SOURCE:TARGET of two different sensors, got {spec!r}")
        check([src, tgt], LIDAR_PRESETS, "sensor")
        for family in check_families(_split(mixed_families), "outdoor", "mixed families"):
            specs.append(Cell(f"{src}>{tgt}/{family}", "mixed", "outdoor", family, src, tgt))
    named = parse_worlds(worlds)
    unknown = sorted(set(named) - {c.key for c in specs})
    if unknown:
        raise ValueError(f"--worlds names cells the matrix does not have: {', '.join(unknown)} "
                         f"(its cells: {', '.join(c.key for c in specs)})")
    if len(set(named.values())) != len(named):
        raise ValueError(f"--worlds gives one world to two cells: {worlds}")
    taken: set[int] = set(named.values())
    for cell in specs:
        cell.seed = named[cell.key] if cell.key in named else _next_free(cell_seed(base_seed, cell.key), taken)
        taken.add(cell.seed)
    for name in check(_split(real), tuple(REAL_SCALE), "real pair"):
        specs.append(Cell(f"real/{name}", "real", REAL_SCALE[name], dataset=name))
    keys = [c.key for c in specs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"a cell is listed twice: {sorted(k for k in keys if keys.count(k) > 1)}")
    return specs


# ------------------------------------------------------------------------------- pairs


@dataclass
class PairSettings:
    """How a matrix draws its synthetic pairs."""

    n: int = 10  # pairs per cell
    distance: tuple[float, float] = (10.0, 20.0)  # outdoor: metres apart
    indoor_distance: tuple[float, float] = (1.0, 3.0)  # indoor candidates: metres apart
    overlap: tuple[float, float] = (0.3, 0.6)  # indoor: kept when the overlap lies in this range
    min_shared_view: float = 0.05  # below it a pair's clouds saw no common scene (module docstring)
    turn: tuple[float, float] | None = (0.0, 180.0)  # source heading turn, degrees either way
    candidates: int = 4  # indoor: candidates drawn per wanted pair (doubled until enough qualify)
    retries: int = 3  # further seeds when a world's drive is too short


def _with_overlap(pair: Any, voxel: float) -> Any:
    """``pair`` with ``meta["overlap"]`` and ``meta["shared_view"]`` (its :func:`overlap_fractions`
    at ``voxel``, the smaller and the larger)."""
    fractions = overlap_fractions(pair, voxel)
    pair.meta["overlap"], pair.meta["shared_view"] = min(fractions), max(fractions)
    return pair


def _draw(cell: Cell, settings: PairSettings, seed: int) -> list:
    from s2h_ros.datasets.synthetic import synthetic_pairs

    common = {"sensor": cell.sensor, "family": cell.family}
    if cell.target_sensor != cell.sensor:
        common["target_sensor"] = cell.target_sensor
    voxel = SCALE_VOXEL[cell.scale]
    if cell.scale == "outdoor":
        lo, hi = settings.distance
        return [_with_overlap(p, voxel)
                for p in synthetic_pairs(settings.n, seed, min_distance=lo, max_distance=hi, **common)]
    lo, hi = settings.indoor_distance
    keep: list = []
    m = settings.n * settings.candidates
    while True:
        keep = []
        for pair in synthetic_pairs(m, seed, min_distance=lo, max_distance=hi, **common):
            if settings.overlap[0] <= _with_overlap(pair, voxel).meta["overlap"] <= settings.overlap[1]:
                keep.append(pair)
                if len(keep) == settings.n:
                    return keep
        if m >= 64 * settings.n:
            raise RuntimeError(f"only {len(keep)} of {m} candidate pairs had "
                               f"{settings.overlap[0]:.0%}-{settings.overlap[1]:.0%} overlap")
        m *= 2


def cell_pairs(cell: Cell, settings: PairSettings, taken: set[int] | None = None) -> list:
    """The cell's pairs. A synthetic world whose drive is too short for them (or, indoors, has too
    few pairs in the overlap range) is replaced by the next free held-out seed (``cell.seed``
    changes; ``cell.seeds_tried`` keeps the ones given up); ``taken``: seeds other cells hold."""
    from s2h_ros.datasets.types import turned_pairs

    if cell.kind == "real":
        if cell.dataset == "kitti-loop":
            from s2h_ros.datasets.kitti import kitti_loop_pair

            return [kitti_loop_pair()]
        from s2h_ros.datasets.threedmatch import threedmatch_demo_pair

        return [threedmatch_demo_pair()]
    taken = set(taken or ())
    for attempt in range(settings.retries + 1):
        try:
            pairs = _draw(cell, settings, int(cell.seed))
            break
        except RuntimeError:
            if attempt == settings.retries:
                raise
            cell.seeds_tried.append(int(cell.seed))
            taken.add(int(cell.seed))
            cell.seed = _next_free(int(cell.seed), taken)
    if settings.turn is None:
        return pairs
    low, high = settings.turn
    return list(turned_pairs(pairs, low, high, cell.seed))


# --------------------------------------------------------------------------------- run


def _pair_meta(pair: Any) -> dict:
    keep = ("dataset", "family", "sensor", "target_sensor", "seed", "frames", "distance", "turn_deg", "overlap",
            "shared_view")
    return {k: pair.meta[k] for k in keep if k in pair.meta}


def evaluate_matrix(cells: list[Cell], methods: dict[str, dict[str, Any]], settings: PairSettings,
                    on_record: Callable[[dict], None], progress: bool = False,
                    on_cell: Callable[[Cell, list[dict]], None] | None = None) -> None:
    """Every cell's pairs through every method of its scale (``methods[scale][name]``); each pair
    record (``evaluate_pairs``'s, plus ``cell``, ``scale``, ``data`` and the pair's ``meta``)
    goes to ``on_record`` as it is made; ``on_cell`` sees each finished cell and its records."""
    from s2h_ros.evaluation.harness import evaluate_pairs

    synthetic = {c.seed for c in cells if c.seed is not None}
    for cell in cells:
        pairs = cell_pairs(cell, settings, synthetic - {cell.seed})
        if cell.seed is not None:
            synthetic.add(cell.seed)
        metas = {p.name: _pair_meta(p) for p in pairs}
        done: list[dict] = []

        def tagged(record: dict, cell: Cell = cell, metas: dict = metas, done: list = done) -> None:
            record.update(cell=cell.key, scale=cell.scale, data=cell.data, meta=metas.get(record["pair"], {}))
            done.append(record)
            on_record(record)

        evaluate_pairs(methods[cell.scale], pairs, cell.threshold, progress=progress, on_record=tagged)
        if on_cell is not None:
            on_cell(cell, done)


def without_view(record: dict, min_shared_view: float = PairSettings.min_shared_view) -> bool:
    """Whether a record's pair had no shared view (``meta["shared_view"]`` below ``min_shared_view``;
    pairs that do not record it, the real ones, have one)."""
    return record.get("meta", {}).get("shared_view", 1.0) < min_shared_view


def summarize_matrix(cells: list[Cell], records: list[dict],
                     min_shared_view: float = PairSettings.min_shared_view) -> dict[str, dict[str, dict]]:
    """``{cell key: {method: summary}}`` over the records made so far (cells without any left out);
    each summary is ``summarize_method``'s (``trusted``, ``wrong_trusted``, the safeguard's
    ``fallbacks`` included) plus ``gt_inlier_ratio_mean`` (S2H methods), ``feature_kinds`` (the
    features s2h used there: fcgf, or fpfh where no weights apply), ``no_view`` (pairs without a
    shared view, :func:`without_view`) and ``recall_in_view`` (the recall over the others; None
    when there are none)."""
    from s2h_ros.evaluation.harness import summarize_records

    out: dict[str, dict[str, dict]] = {}
    for cell in cells:
        mine = [r for r in records if r.get("cell") == cell.key]
        if not mine:
            continue
        summary = summarize_records(mine, cell.threshold)
        for name, s in summary.items():
            s["gt_inlier_ratio_mean"] = s["info_mean"].get("gt_inlier_ratio")
            own = [r for r in mine if r["method"] == name]
            s["feature_kinds"] = sorted({r["info"].get("feature_kind") for r in own} - {None, ""})
            in_view = [bool(r["registered"]) for r in own if not without_view(r, min_shared_view)]
            s["no_view"] = len(own) - len(in_view)
            s["recall_in_view"] = float(np.mean(in_view)) if in_view else None
        out[cell.key] = summary
    return out


def cell_record(cell: Cell) -> dict:
    """A cell as the JSON lists it."""
    return {"key": cell.key, "kind": cell.kind, "scale": cell.scale, "data": cell.data, "dataset": cell.dataset,
            "family": cell.family, "sensor": cell.sensor, "target_sensor": cell.target_sensor, "seed": cell.seed,
            "seeds_tried": list(cell.seeds_tried), "threshold": vars(cell.threshold),
            "voxel": SCALE_VOXEL[cell.scale]}


def has_matches(method: str) -> bool:
    """Methods whose records carry the ground-truth inlier fraction of their matches (s2h ones)."""
    return method.split(":", 1)[0] == "s2h"


def matrix_table(cells: list[Cell], summary: dict[str, dict[str, dict]], methods: list[str]) -> str:
    """Markdown: one row per cell: its pairs and those without a shared view; per method recall (%)
    over all pairs and over those with a shared view, mean RE (deg) and TE (cm) over the
    registered pairs, for s2h methods the S2H matches' ground-truth inlier fraction, the pairs
    reported as trusted and those of them that are wrong (FPFH + RANSAC trusts every result), the
    pairs whose transform came from the RANSAC safeguard (of them trusted), and s / pair."""
    from s2h_ros.evaluation.report import _fmt, markdown_table

    header = ["cell", "data", "seed", "pairs", "no shared view"]
    for m in methods:
        header += [f"{m} recall (%)", f"{m} recall, shared view (%)", f"{m} RE (deg)", f"{m} TE (cm)"]
        header += [f"{m} inlier frac.", f"{m} trusted", f"{m} wrong trusted", f"{m} RANSAC (trusted)"] \
            if has_matches(m) else []
        header += [f"{m} s/pair"]
    rows = []
    for cell in cells:
        if cell.key not in summary:
            continue
        by_method = summary[cell.key]
        pairs = max(s["pairs"] for s in by_method.values())
        no_view = max(s["no_view"] for s in by_method.values())
        row = [cell.key, cell.data, "-" if cell.seed is None else str(cell.seed), str(pairs), str(no_view)]
        for m in methods:
            s = by_method.get(m)
            if s is None:
                row += ["-"] * (9 if has_matches(m) else 5)
                continue
            row += [_fmt(s["recall"], 100, 0), _fmt(s["recall_in_view"], 100, 0), _fmt(s["re_mean_deg"]),
                    _fmt(s["te_mean_m"], 100, 1)]
            row += [_fmt(s["gt_inlier_ratio_mean"], 1, 3), str(s["trusted"]), str(s["wrong_trusted"]),
                    "-" if s["fallbacks"] is None else f"{s['fallbacks']} ({s['trusted_fallbacks']})"] \
                if has_matches(m) else []
            row += [_fmt(s["time_mean_s"], 1, 2)]
        rows.append(row)
    return markdown_table(header, rows)


def cell_group(cell: Cell) -> str:
    """The totals' group of a cell (``GROUPS``): real pairs, mixed-sensor cells, indoor cells, and
    outdoor cells apart from the degenerate families (``DEGENERATE_FAMILIES``)."""
    if cell.kind in ("real", "mixed"):
        return cell.kind
    if cell.scale == "indoor":
        return "indoor"
    return "outdoor, degenerate" if cell.family in DEGENERATE_FAMILIES else "outdoor"


def matrix_totals(cells: list[Cell], records: list[dict], methods: list[str],
                  min_shared_view: float = PairSettings.min_shared_view) -> dict[str, dict[str, dict]]:
    """``{group: {method: counts}}`` over the records made so far (``GROUPS``; "all" is every
    pair): ``pairs``, ``registered`` (within the cell's recall thresholds), ``in_view`` and
    ``registered_in_view`` (pairs with a shared view, :func:`without_view`), ``trusted``,
    ``wrong_trusted``, ``fallbacks`` and ``trusted_fallbacks`` (``harness.trust_counts``: None for
    methods that do not report the RANSAC safeguard), and ``fallback_reasons`` (``{reason: pairs}``,
    where ``fallbacks`` is not None): what issue 12 asks to be reported, the fallback rate, read per
    group because the safeguard lives where the learned path finds nothing."""
    from s2h_ros.evaluation.harness import trust_counts

    group_of = {c.key: cell_group(c) for c in cells}
    out: dict[str, dict[str, dict]] = {}
    for group in GROUPS:
        for method in methods:
            own = [r for r in records if r["method"] == method
                   and (group == "all" or group_of.get(r.get("cell")) == group)]
            if not own:
                continue
            seen = [r for r in own if not without_view(r, min_shared_view)]
            counts: dict[str, Any] = {
                "pairs": len(own), "registered": sum(bool(r["registered"]) for r in own),
                "in_view": len(seen), "registered_in_view": sum(bool(r["registered"]) for r in seen),
                **trust_counts(own), "fallback_reasons": None}
            if counts["fallbacks"] is not None:
                reasons: dict[str, int] = {}
                for r in own:
                    if r["info"]["used_fallback"]:
                        reason = _reason(r["info"].get("fallback", ""))
                        reasons[reason] = reasons.get(reason, 0) + 1
                counts["fallback_reasons"] = reasons
            out.setdefault(group, {})[method] = counts
    return out


def _reason(fallback: str) -> str:
    """A fallback reason without its numbers ("inlier weight sum below 30" -> "inlier weight sum
    below"), so that the totals count kinds; "unknown" for records made before reasons were kept."""
    words = [w for w in fallback.split() if not w.replace(".", "", 1).isdigit()]
    return " ".join(words) or "unknown"


def totals_table(totals: dict[str, dict[str, dict]], methods: list[str]) -> str:
    """Markdown: one row per group and method: pairs, recall (%) over all and over those with a
    shared view, trusted, wrong trusted, and for s2h methods the RANSAC safeguard's transforms (of
    them trusted) with their share of the pairs and the reasons."""
    from s2h_ros.evaluation.report import _fmt, markdown_table

    header = ["cells", "method", "pairs", "recall (%)", "recall, shared view (%)", "trusted", "wrong trusted",
              "RANSAC (trusted)", "RANSAC share (%)", "RANSAC why"]
    rows = []
    for group in GROUPS:
        for method in methods:
            t = totals.get(group, {}).get(method)
            if t is None:
                continue
            safeguard = t["fallbacks"] is not None
            rows.append([group, method, str(t["pairs"]), _fmt(t["registered"] / t["pairs"], 100, 0),
                         _fmt(t["registered_in_view"] / t["in_view"] if t["in_view"] else None, 100, 0),
                         str(t["trusted"]), str(t["wrong_trusted"]),
                         f"{t['fallbacks']} ({t['trusted_fallbacks']})" if safeguard else "-",
                         _fmt(t["fallbacks"] / t["pairs"], 100, 1) if safeguard else "-",
                         ", ".join(f"{k} {v}" for k, v in sorted(t["fallback_reasons"].items())) if safeguard
                         and t["fallback_reasons"] else "-"])
    return markdown_table(header, rows)


def recall_grid(cells: list[Cell], summary: dict[str, dict[str, dict]],
                methods: list[str]) -> tuple[list[str], np.ndarray]:
    """(row labels, ``(cells, methods)`` recall in %, NaN where a method has no record)."""
    keys = [c.key for c in cells if c.key in summary]
    grid = np.full((len(keys), len(methods)), np.nan)
    for i, key in enumerate(keys):
        for j, m in enumerate(methods):
            if m in summary[key]:
                grid[i, j] = 100.0 * summary[key][m]["recall"]
    return keys, grid

