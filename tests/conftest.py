from __future__ import annotations

import sys
from pathlib import Path

# the multi-process harness lives beside the tests
sys.path.insert(0, str(Path(__file__).parent))
