"""examples/python/compare_numpy.py runs and agrees with NumPy (train.py needs the extras)."""
import os
import pathlib
import subprocess
import sys

import rag


def test_compare_numpy(root):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(rag.__file__).parent)] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    script = root / "examples" / "python" / "compare_numpy.py"
    out = subprocess.run([sys.executable, str(script), "--lengths", "3,0,7"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "max error" in out.stdout
