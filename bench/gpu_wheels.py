"""The wheels `python -m bench.gpu_check --e2e` needs on a GPU machine that has PyTorch, transformers, safetensors,
numpy, pyyaml, tqdm and prometheus-client but not pydantic (the config) or math-verify (the reward), downloaded for
CPython 3.12 on manylinux x86_64 into one folder (10.1 MB):

    python -m bench.gpu_wheels                    # into .whl/ (git ignores it), the versions installed here
    python -m bench.gpu_wheels --out DIR --json wheels.json

There, before the check (no package registry needed):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site

The versions are the ones this environment runs (the suite tested them), each wheel fetched without its
dependencies (`pip download --no-deps --only-binary=:all:`): the list below is the closure, checked against each
wheel's Requires-Dist. sympy and mpmath come along although such machines often have them: the versions
latex2sympy2_extended was tested with. Prints each wheel and the total size, which must stay under the device's
64 MiB of carried files.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from bench import ROOT, add_json_option, run, write_figures

# pydantic and what it needs (pcl.config); math-verify and what it needs (pcl.reward)
PACKAGES = ("pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions", "math-verify",
            "latex2sympy2_extended", "antlr4-python3-runtime", "sympy", "mpmath")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
LIMIT_BYTES = 64 << 20  # what the device machine takes beside the working tree


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / ".whl"), help="the folder (default: .whl/ in the repository)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={version(name)}" for name in PACKAGES]
    platforms = [flag for p in PLATFORMS for flag in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(out), *pins],
                   check=True)
    wheels = sorted(out.glob("*.whl"))
    sizes = {w.name: w.stat().st_size for w in wheels}
    total = sum(sizes.values())
    for name, size in sizes.items():
        print(f"  {size / 1e6:6.2f} MB  {name}")
    print(f"{len(wheels)} wheels in {out}: {total / 1e6:.1f} MB, {total / LIMIT_BYTES:.1%} of the device's 64 MiB")
    figures = {"folder": str(out), "wheels": sizes, "total_bytes": total, "share_of_limit": total / LIMIT_BYTES,
               "exit_code": int(total > LIMIT_BYTES)}
    return write_figures(args.json, figures)


if __name__ == "__main__":
    run(main)
