"""pip install of the s2h_ros Python package (core library, CLI, and ROS wrapper code).

The core library (everything but ``s2h_ros.ros``) needs no ROS. The ROS executables need
rclpy and the generated ``s2h_ros.msg`` module, which come from a ROS 2 install (colcon build
of this package) or from ``scripts/setup.sh`` (ROS 2 Kilted wheels from PyPI plus a rosidl
build into the virtual environment).
"""
from setuptools import find_packages, setup

setup(
    name="s2h_ros",
    version="0.1.0",
    description="Soft-to-hard matching scan registration (SHM_DGR) as a library, CLI and ROS 2 node",
    license="MIT",
    python_requires=">=3.10",
    packages=find_packages(include=["s2h_ros", "s2h_ros.*"]),
    package_data={"s2h_ros": ["weights/*.pt", "weights/*.md", "data/**/*"]},
    include_package_data=True,
    # Ranges only (as requirements.txt): an installed CUDA torch satisfies torch>=2.1 and stays.
    install_requires=[
        "numpy>=1.24,<3",
        "scipy>=1.11",
        "threadpoolctl>=3.1",
        "torch>=2.1",
        "tqdm>=4.65",
        "matplotlib>=3.7",
        "rosbags>=0.10",
        "PyYAML>=6",
    ],
    extras_require={
        # Open3D (registration's RANSAC/ICP/FPFH, PLY/PCD I/O, the simulator's ray casting):
        # not a hard requirement because it comes as two distributions of one module, `open3d`
        # and `open3d-cpu` (requirements.txt); install one of them, never both.
        "open3d": ["open3d>=0.18"],
        "baselines": ["open3d>=0.18", "kiss-icp>=1.0"],
        "test": ["pytest>=7,<9", "PyYAML>=6", "kiss-icp>=1.0"],
    },
    entry_points={
        "console_scripts": [
            "s2h = s2h_ros.cli:main",
            "registration_node = s2h_ros.ros.registration_node:main",
            "kitti_replay = s2h_ros.ros.kitti_replay:main",
        ],
    },
)
