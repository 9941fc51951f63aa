"""One Horovod rank: ``python _worker.py OUT_DIR module:function [json-args]``.

Started by ``hvdrun`` under horovodrun. Imports the function from this folder, calls it
with the decoded arguments and writes its pickled result to ``OUT_DIR/rank<R>.pkl``, or
its traceback to ``OUT_DIR/rank<R>.err`` and exits 1 (horovodrun then stops the others).
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import sys
import traceback
from pathlib import Path


def main() -> int:
    out, target = Path(sys.argv[1]), sys.argv[2]
    args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else []
    rank = os.environ.get("HOROVOD_RANK", "0")
    module, _, name = target.partition(":")
    try:
        result = getattr(importlib.import_module(module), name)(*args)
        data = pickle.dumps(result)
    except BaseException:
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        sys.stderr.write(f"rank {rank} failed\n")
        return 1
    (out / f"rank{rank}.pkl.tmp").write_bytes(data)
    (out / f"rank{rank}.pkl.tmp").rename(out / f"rank{rank}.pkl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
