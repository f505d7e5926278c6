import sys
from pathlib import Path

# Test helpers (specs.py, e2e/kit.py) import by their own names.
sys.path.insert(0, str(Path(__file__).parent))
