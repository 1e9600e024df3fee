import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
# The kernels' Python launcher lives in kernels/python (not part of the pdserve wheel).
sys.path.insert(0, str(REPO / "kernels" / "python"))
