"""Refinement of a registration: robust point-to-plane ICP on the voxels (Open3D, or
:mod:`s2h_ros.icp` on the configured device) and the fine stage on the input points (no ROS).

``Registrar`` bounds how far the fine stage may move a result (``pipeline.FINE_MAX_TURN_DEG``).
"""
from __future__ import annotations

import numpy as np

from s2h_ros.config import RegistrationConfig
from s2h_ros.surface import estimate_normals


def icp_on_device(cfg: RegistrationConfig) -> bool:
    """Whether ``refine_icp`` runs on ``cfg.device`` (s2h_ros.icp) rather than in Open3D (``icp_backend``)."""
    if cfg.icp_backend == "auto":
        return cfg.device != "cpu"
    return cfg.icp_backend == "torch"


def refine_icp(src: np.ndarray, tgt: np.ndarray, T: np.ndarray, cfg: RegistrationConfig,
               tgt_normals: np.ndarray | None = None, coarse: float = 0.0) -> np.ndarray:
    """Robust (Tukey) point-to-plane ICP from ``T`` on the voxelised clouds: Open3D, or the same
    iteration on ``cfg.device`` (``icp_on_device``); the target's ``(M, 3)`` normals are
    estimated here unless given (a keyframe's are computed once). Correspondences within two
    voxels, the Tukey parameter one voxel. ``coarse``: metres; when more than two voxels, a first
    ICP takes correspondences that far apart (the Tukey parameter half of it), so that a start a
    few degrees off converges (at 30 m a 5 deg turn moves a voxel 2.6 m)."""
    normals = estimate_normals(tgt, cfg.voxel_size, cfg.device) if tgt_normals is None else tgt_normals
    fine = 2.0 * cfg.voxel_size
    distances = ([coarse] if coarse > fine else []) + [fine]
    if icp_on_device(cfg):
        from s2h_ros.icp import point_to_plane_icp

        for distance in distances:
            T = point_to_plane_icp(src, tgt, normals, T, distance, distance / 2, cfg.refine_tolerance,
                                   cfg.refine_iters, cfg.device)
        return T
    import open3d as o3d

    ps = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(src.astype(np.float64)))
    pt = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(tgt.astype(np.float64)))
    pt.normals = o3d.utility.Vector3dVector(np.asarray(normals, dtype=np.float64))
    return open3d_point_to_plane(ps, pt, T, distances, cfg.refine_tolerance, cfg.refine_iters)


def open3d_point_to_plane(source, target, T: np.ndarray, distances: list[float], tolerance: float,
                          iterations: int) -> np.ndarray:
    """``(4, 4)``: Open3D's robust point-to-plane ICP of the ``source`` point cloud onto ``target``
    (an Open3D cloud with normals) from ``T``, once per correspondence distance in ``distances``,
    each with a Tukey kernel of half that distance; ``tolerance``: Open3D's relative fitness and
    RMSE criteria; ``iterations``: at most, per distance."""
    import open3d as o3d

    reg = o3d.pipelines.registration
    for distance in distances:
        res = reg.registration_icp(source, target, distance, T,
                                   reg.TransformationEstimationPointToPlane(reg.TukeyLoss(k=distance / 2)),
                                   reg.ICPConvergenceCriteria(tolerance, tolerance, iterations))
        T = np.asarray(res.transformation, dtype=np.float64)
    return T


# The fine stage runs at most FINE_ITERATIONS ICP iterations. The target's normals come from at most
# FINE_NORMAL_NEIGHBOURS points within FINE_NORMAL_RADIUS_VOXELS x voxel_size (1.5 m at 0.3 m
# voxels): wider than a 16-32-beam lidar's ring spacing on the ground and on walls 10-20 m off, so
# that a normal is the surface's, not one ring's.
FINE_ITERATIONS = 50
FINE_NORMAL_NEIGHBOURS = 30
FINE_NORMAL_RADIUS_VOXELS = 5.0


def fine_registration(src: np.ndarray, tgt: np.ndarray, T: np.ndarray, cfg: RegistrationConfig) -> np.ndarray:
    """``(4, 4)`` robust point-to-plane ICP (Open3D, Tukey kernel of half ``cfg.voxel_size``) of
    ``(N, 3)`` onto ``(M, 3)`` input points, both downsampled at ``cfg.fine_voxel``, correspondences
    within ``cfg.voxel_size``, from ``T``: the pair's fine stage. The target's normals are fitted
    over a patch wider than a sparse lidar's rings (``FINE_NORMAL_RADIUS_VOXELS``). Generalized ICP
    with its own 20-neighbour covariances, the stage before 2026-12-06, fitted each ring's line and
    tilted 16-32-beam results (VLP-16 parking lot of world 927, where this stage was chosen: mean
    RE 0.29 deg without a stage, 0.54 with that one, 0.18 with this one; held out, matrix base 4321,
    252 pairs: mean RE 0.081 -> 0.066 deg, worst cell 0.42 -> 0.31; docs/evaluation.md, "The fine
    stage again"). Its fitness says nothing of whether it helped, so ``Registrar`` bounds how far
    it may move a result instead."""
    import open3d as o3d

    def cloud(xyz: np.ndarray):
        points = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.asarray(xyz, dtype=np.float64)))
        return points.voxel_down_sample(cfg.fine_voxel)

    source, target = cloud(src), cloud(tgt)
    target.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(FINE_NORMAL_RADIUS_VOXELS * cfg.voxel_size,
                                                                 FINE_NORMAL_NEIGHBOURS))
    return open3d_point_to_plane(source, target, np.asarray(T, dtype=np.float64), [cfg.voxel_size], 1e-6,
                                 FINE_ITERATIONS)
