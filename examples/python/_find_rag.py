"""Makes `import rag` work from a source checkout: an installed rag (pip install .) or one on
PYTHONPATH wins; otherwise the module built in $RAG_BUILD/bindings or build/bindings is used."""
import importlib.util
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

if importlib.util.find_spec("rag") is None:
    for build in (os.environ.get("RAG_BUILD"), ROOT / "build"):
        if build and (pathlib.Path(build) / "bindings").is_dir():
            sys.path.insert(0, str(pathlib.Path(build) / "bindings"))
            break
    if importlib.util.find_spec("rag") is None:
        sys.exit("cannot import rag: build it (./dev build) and set PYTHONPATH=<build>/bindings, "
                 "or pip install the repository")
