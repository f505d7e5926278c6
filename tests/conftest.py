import sys
from pathlib import Path

# Test helpers (specs.py, e2e/kit.py) import by their own names, and so do the local
# cluster's modules (ports.py for free ports, localcluster.py).
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent / "cluster"))
