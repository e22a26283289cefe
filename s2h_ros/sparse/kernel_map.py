"""Kernel maps of sparse convolution: which input voxel feeds which output voxel through which
kernel offset, built by integer-coordinate hashing and a key lookup.

Written here rather than taken from a library: the maintained GPU libraries (MinkowskiEngine,
spconv, TorchSparse) either do not build on current CUDA/Python or give wrong results on CPU
(see ../shared/notes/sparse-conv-and-libraries.md); int64 keys looked up in a dense table or
with ``torch.searchsorted`` run on any device. Coordinates are (N, 1 + D) int64 rows
``[batch, x_1 .. x_D]`` in stride-1 voxel units; a tensor at stride s holds multiples of s, as
in MinkowskiEngine.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

_KEY_LIMIT = 2**62  # keys stay well inside int64
_KEY_MARGIN = 64  # voxels per axis that kernel offsets at strides up to 8 may add to a cloud's span
_QUERY_BUDGET = 1 << 22  # rows of (offset, voxel) queries handled at once
_TABLE_LIMIT = 1 << 22  # largest key range looked up through a dense int32 table (16 MB); above it
# sorted keys + binary search. Filling a 64 MB table per layer cost more than the search (CPU, KITTI
# scan at 0.3 m: 209 -> 131 ms per FCGF forward with 1 << 22; 1 << 20 and 0 measured 134 and 141 ms).


def kernel_offsets(kernel_size: int, dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(K, D) int64 offsets of an odd cubic kernel, x fastest (MinkowskiEngine's weight order):
    k = sum_d (o_d + r) (2r + 1)^d with r = kernel_size // 2."""
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel size must be odd and positive, got {kernel_size}")
    r = kernel_size // 2
    rows = [tuple(reversed(o)) for o in itertools.product(range(-r, r + 1), repeat=dim)]
    return torch.tensor(rows, dtype=torch.long, device=device).reshape(-1, dim)


def _radix(extent: torch.Tensor) -> torch.Tensor:
    """Place values of a mixed-radix number whose first digit is the most significant."""
    return torch.cumprod(torch.cat([extent[1:], extent.new_ones(1)]).flip(0), 0).flip(0)


def coordinate_keys(coords: torch.Tensor, lo: torch.Tensor, extent: torch.Tensor) -> torch.Tensor:
    """(N,) int64 keys of (N, 1 + D) coordinates inside the box [lo, lo + extent); key order is the
    lexicographic order of the rows."""
    return ((coords - lo) * _radix(extent)).sum(1)


def unique_rows(coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Lexicographically sorted unique rows of (N, K) int64 coordinates and the (N,) inverse index
    (the same as ``torch.unique(dim=0)``, through 1-D keys, which is much faster; rows spanning
    too many cells for one int64 key take ``torch.unique(dim=0)`` itself)."""
    lo, hi = coords.min(0).values, coords.max(0).values
    if _cell_count(hi - lo + 1) >= _KEY_LIMIT:
        return torch.unique(coords, dim=0, return_inverse=True)
    lo, extent = _key_frame(lo, hi)
    keys, inverse = torch.unique(coordinate_keys(coords, lo, extent), return_inverse=True)
    digits = []
    for place, size in zip(_radix(extent).tolist(), extent.tolist()):
        digits.append(torch.div(keys, place, rounding_mode="floor") % size)
    return torch.stack(digits, 1) + lo, inverse


def keys_fit(extent: list[int]) -> bool:
    """Whether one cloud's coordinates spanning ``extent`` voxels per axis can be hashed by
    :func:`build_kernel_map` (which raises otherwise): the key box, widened by ``_KEY_MARGIN`` per
    axis for kernel offsets at coarse strides, must hold fewer than ``_KEY_LIMIT`` cells."""
    total = 1
    for e in extent:
        total *= int(e) + _KEY_MARGIN
    return total < _KEY_LIMIT


def max_key_span(dim: int) -> int:
    """Largest span, in voxels, that every axis of a ``dim``-D cloud may have with :func:`keys_fit`."""
    span = int(_KEY_LIMIT ** (1.0 / dim)) + 1
    while not keys_fit([span - _KEY_MARGIN] * dim):
        span -= 1
    return span - _KEY_MARGIN


def _cell_count(extent: torch.Tensor) -> int:
    """Cells of a box with this extent per axis (exact, as a Python int)."""
    total = 1
    for e in extent.tolist():
        total *= int(e)
    return total


def _key_frame(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    extent = hi - lo + 1
    if _cell_count(extent) >= _KEY_LIMIT:
        raise ValueError(
            f"sparse coordinates span {extent.tolist()} voxels per axis: too large to hash into int64 keys; "
            "use a larger voxel size or crop the input"
        )
    return lo, extent


def downsample(coords: torch.Tensor, stride: int) -> torch.Tensor:
    """Coordinates floored to multiples of ``stride`` (batch column kept), unique and sorted."""
    out = coords.clone()
    out[:, 1:] = torch.div(coords[:, 1:], stride, rounding_mode="floor") * stride
    return unique_rows(out)[0]


@dataclass
class KernelMap:
    """Input/output row pairs per occupied kernel offset: ``out[o] += in[i] @ W[k]``.

    ``kernel_ids`` (list of k) and, for each, ``in_idx`` / ``out_idx`` (P_k,) int64; offsets that
    hit no voxel are absent, so a 6-D kernel with 729 offsets costs only its occupied ones.
    """

    kernel_ids: list[int]
    in_idx: list[torch.Tensor]
    out_idx: list[torch.Tensor]
    n_in: int
    n_out: int
    identity: int | None = None  # offset k with in == out row for every row (centre of a stride-1 map)
    device: torch.device | None = None  # where the index tensors live
    _transposed: KernelMap | None = field(default=None, repr=False)
    _table: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    def transposed(self) -> KernelMap:
        """The same pairs read backwards (transposed convolution), built once."""
        if self._transposed is None:
            self._transposed = KernelMap(self.kernel_ids, self.out_idx, self.in_idx, self.n_out, self.n_in,
                                         self.identity, self.device)
        return self._transposed

    def neighbour_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(N_out, K') int64`` input row of every output row per occupied offset (``n_in`` where
        none) and the K' offsets' kernel ids ``(K',) int64``, the centre included, both on the
        map's device: each (output, offset) has at most one input, so a convolution is one gather
        and one matmul (``sparse_conv``). Built once."""
        if self._table is None:
            ids = list(self.kernel_ids)
            ins, outs = list(self.in_idx), list(self.out_idx)
            if self.identity is not None:
                rows = torch.arange(self.n_out, device=self.device)
                ids, ins, outs = ids + [self.identity], ins + [rows], outs + [rows]
            table = torch.full((self.n_out, len(ids)), self.n_in, dtype=torch.long, device=self.device)
            if ids:
                column = torch.repeat_interleave(torch.arange(len(ids), device=self.device),
                                                 torch.tensor([len(i) for i in ins], device=self.device))
                table[torch.cat(outs), column] = torch.cat(ins)
            self._table = (table, torch.tensor(ids, dtype=torch.long, device=self.device))
        return self._table

    def __len__(self) -> int:
        return sum(int(i.numel()) for i in self.in_idx) + (self.n_in if self.identity is not None else 0)


class _KeyLookup:
    """Row index of each of a set of unique coordinate rows, -1 for rows not in it, by direct
    addressing:

    - one table over the whole key box when it is small (at most ``_TABLE_LIMIT`` cells);
    - else a **column table**: all digits but the last (batch, x, y of a 3-D cloud) name a column
      of the grid, the last (z) a cell in it. One table maps each column of the box to its rank
      among the occupied columns (-1: empty), a second holds the row of each (occupied column, z)
      cell. Both stay small where the cloud is a surface seen from above or beside (a KITTI scan
      at 0.3 m: a 20 M-cell box, about 0.3 M columns, 15 k of them occupied, x 70 heights), and a
      lookup is two gathers instead of a binary search (``prepare()`` of the real RAW KITTI scans,
      FCGF at 0.3 m, one thread: 151 -> 131 ms median, the same features bit for bit);
    - else sorted keys and a binary search (``torch.searchsorted``).

    Queries come as :meth:`parts` of rows, which add: ``parts(x + s) = parts(x) + parts(s + lo)``.
    """

    def __init__(self, rows: torch.Tensor, lo: torch.Tensor, extent: torch.Tensor):
        self.lo, self.extent = lo, extent
        index = torch.arange(rows.shape[0], device=rows.device, dtype=torch.int32)
        self.table = self.columns = self.keys = None
        key_range, last = _cell_count(extent), int(extent[-1])
        if key_range <= _TABLE_LIMIT:
            self.table = torch.full((key_range,), -1, dtype=torch.int32, device=rows.device)
            self.table[coordinate_keys(rows, lo, extent)] = index
            return
        if key_range // last <= _TABLE_LIMIT:
            column, height = self._split(rows)
            occupied, rank = torch.unique(column, return_inverse=True)
            if occupied.numel() * last <= _TABLE_LIMIT:
                self.last = last
                self.columns = torch.full((key_range // last,), -1, dtype=torch.int32, device=rows.device)
                self.columns[occupied] = torch.arange(occupied.numel(), dtype=torch.int32, device=rows.device)
                self.table = torch.full((occupied.numel() * last,), -1, dtype=torch.int32, device=rows.device)
                self.table[rank * last + height] = index
                return
        self.keys, self.order = torch.sort(coordinate_keys(rows, lo, extent))

    def _split(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return coordinate_keys(rows[:, :-1], self.lo[:-1], self.extent[:-1]), rows[:, -1] - self.lo[-1]

    def parts(self, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(N, 1 + D)`` rows as queries: ``(key,)``, or ``(column, height)`` for a column table."""
        return self._split(rows) if self.columns is not None else (coordinate_keys(rows, self.lo, self.extent),)

    def __call__(self, *parts: torch.Tensor) -> torch.Tensor:
        """Row of each query (:meth:`parts` of rows inside the box), -1 where absent."""
        if self.columns is not None:
            column, height = parts
            rank = self.columns[column].long()
            return torch.where(rank >= 0, self.table[(rank * self.last + height).clamp_(min=0)].long(), -1)
        (queries,) = parts
        if self.table is not None:
            return self.table[queries].long()
        pos = torch.searchsorted(self.keys, queries).clamp_(max=self.keys.numel() - 1)
        return torch.where(self.keys[pos] == queries, self.order[pos], -1)


def build_kernel_map(
    in_coords: torch.Tensor, out_coords: torch.Tensor, offsets: torch.Tensor, step: int
) -> KernelMap:
    """Pairs (i, o, k) with in_coords[i] == out_coords[o] + step * offsets[k] (same batch).

    Hashes the coordinates to int64 keys and looks every (offset, output) query up in the input
    keys (:class:`_KeyLookup`), a few offsets at a time to bound memory. Every coordinate and
    query is a multiple of ``step`` (the input's tensor stride; the output's is the same or a
    multiple), so the keys count cells of that size: a stride-s lookup box has s^D times fewer
    cells than one in stride-1 units (its tables are filled and read per map; the same pairs).
    """
    dim = offsets.shape[1]
    if in_coords.shape[1] != dim + 1 or out_coords.shape[1] != dim + 1:
        raise ValueError(f"coordinates must be (N, 1 + {dim}), got {tuple(in_coords.shape)}, {tuple(out_coords.shape)}")
    same = in_coords is out_coords
    if step > 1:
        in_coords = _in_units(in_coords, step)
        out_coords = in_coords if same else _in_units(out_coords, step)
    offsets = offsets.to(out_coords.device)
    shift = torch.cat([offsets.new_zeros(offsets.shape[0], 1), offsets], 1)  # (K, 1 + D)
    lo = torch.minimum(in_coords.min(0).values, out_coords.min(0).values + shift.min(0).values)
    hi = torch.maximum(in_coords.max(0).values, out_coords.max(0).values + shift.max(0).values)
    lo, extent = _key_frame(lo, hi)
    lookup = _KeyLookup(in_coords, lo, extent)
    out_parts = lookup.parts(out_coords)
    shift_parts = lookup.parts(shift + lo)  # parts(x + s) = parts(x) + parts(s + lo)
    n_in, n_out = in_coords.shape[0], out_coords.shape[0]
    n_offsets = shift.shape[0]
    zero = [k for k, row in enumerate(offsets.tolist()) if not any(row)]
    identity = zero[0] if same and zero else None
    # On one coordinate set, offset K-1-k is -offset k (the kernel is point-symmetric), so its
    # pairs are those of k read backwards: only the first half of the offsets is looked up.
    mirror = same and identity == n_offsets // 2 and bool((offsets + offsets.flip(0) == 0).all())
    looked_up = n_offsets // 2 if mirror else n_offsets

    ids: list[int] = []
    ins: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []
    chunk = max(1, _QUERY_BUDGET // max(1, n_out))
    for start in range(0, looked_up, chunk):
        stop = min(start + chunk, looked_up)
        found = lookup(*(o[None, :] + s[start:stop, None] for o, s in zip(out_parts, shift_parts)))  # (Kc, N_out)
        k_local, o = (found >= 0).nonzero(as_tuple=True)
        if o.numel() == 0:
            continue
        i = found[k_local, o]
        ks, counts = torch.unique_consecutive(k_local, return_counts=True)
        for k, i_k, o_k in zip(ks.tolist(), i.split(counts.tolist()), o.split(counts.tolist())):
            if start + k == identity:
                continue
            ids.append(start + k)
            ins.append(i_k)
            outs.append(o_k)
    if mirror:
        ids += [n_offsets - 1 - k for k in ids]
        ins, outs = ins + outs, outs + ins
    return KernelMap(ids, ins, outs, n_in, n_out, identity, out_coords.device)


def _in_units(coords: torch.Tensor, step: int) -> torch.Tensor:
    """``(N, 1 + D)`` coordinates whose spatial columns are multiples of ``step``, counted in
    ``step``-sized cells (exact; the batch column as it is)."""
    if bool((coords[:, 1:] % step != 0).any()):
        raise ValueError(f"coordinates are not multiples of the stride {step}")
    return torch.cat([coords[:, :1], torch.div(coords[:, 1:], step, rounding_mode="floor")], 1)


class CoordinateManager:
    """Coordinates per tensor stride and the kernel maps between them, shared by all tensors of one
    input, so every layer that needs the same map (e.g. the two convs of a residual block, or a
    strided conv and the transposed conv that undoes it) builds it once."""

    def __init__(self, coords: torch.Tensor):
        if coords.ndim != 2 or coords.shape[1] < 2:
            raise ValueError(f"coordinates must be (N, 1 + D) [batch, x..], got {tuple(coords.shape)}")
        if coords.shape[0] == 0:
            raise ValueError("sparse tensor has no coordinates (empty input)")
        self.dim = coords.shape[1] - 1
        self.coords: dict[int, torch.Tensor] = {1: coords.long()}
        self._maps: dict[tuple[int, int, int], KernelMap] = {}

    def coordinates(self, stride: int) -> torch.Tensor:
        """(N_s, 1 + D) coordinates at ``stride`` (made by flooring the finest ones if new)."""
        if stride not in self.coords:
            self.coords[stride] = downsample(self.coords[1], stride)
        return self.coords[stride]

    def kernel_map(self, in_stride: int, out_stride: int, kernel_size: int) -> KernelMap:
        """Map of a convolution from stride ``in_stride`` to ``out_stride`` (= in or 2 x in...)."""
        key = (in_stride, out_stride, kernel_size)
        if key not in self._maps:
            cin, cout = self.coordinates(in_stride), self.coordinates(out_stride)
            offsets = kernel_offsets(kernel_size, self.dim, cin.device)
            self._maps[key] = build_kernel_map(cin, cout, offsets, in_stride)
        return self._maps[key]
