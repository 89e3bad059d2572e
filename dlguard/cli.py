"""The ``dlguard`` command."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dlguard", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="train mnist_a on the embedded MNIST with dlguard's callbacks and write a run folder",
    )
    demo.add_argument("--out", type=Path, default=None, help="run folder (default: dlguard-runs/<time>/)")
    demo.add_argument("--fast", action="store_true", help="a short run (under 3 minutes on 2 CPU cores)")
    demo.add_argument(
        "--wandb",
        choices=("offline", "online", "disabled"),
        default=None,
        help="attach a WandbLogger (default: offline when wandb is importable)",
    )
    demo.add_argument("--epochs", type=int, default=None, help="override the number of epochs")
    demo.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dlguard`` with ``argv`` (default: the command line); returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "epochs", None) is not None and args.epochs < 1:
        parser.error(f"--epochs: expected at least 1, got {args.epochs}")
    if args.command == "demo":
        from dlguard.demo import DemoConfig, run_demo

        config = DemoConfig(fast=args.fast, epochs=args.epochs, seed=args.seed)
        if args.out is not None:
            config.out = args.out
        if args.wandb is not None:
            config.wandb = args.wandb
        summary = run_demo(config)
        print(
            f"\nvalidation accuracy {summary['val_acc']:.4f} after {summary['epochs']} epochs "
            f"({summary['duration_s']} s); run folder: {config.out}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
