"""s2h_ros: soft-to-hard matching scan registration (SHM_DGR) as a library, CLI and ROS 2 node.

The core (everything except ``s2h_ros.ros``) never imports ROS.
"""
# The generated message module ``s2h_ros.msg`` may live in another directory named ``s2h_ros``
# on sys.path (rosidl installs it into the ROS/venv prefix's site-packages while this package
# may be installed editable from the source tree). Extending __path__ lets both halves import
# as one package; in a colcon install they already share one directory and this is a no-op.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"
