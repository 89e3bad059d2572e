"""What a loop replays: its failures against its open-loop control's cases, read by models that did not choose them.

    python benchmarks/replayed_failures.py [--loop robustness|metamorphic|hda] [--seeds 0 1 2]
                                           [--properties framework|label_preserving ...]
                                           [--out results.json] [--picture banks.png]

Trains plain, the loop and its control as ``closed_loop.py`` does (``mnist_a`` on the embedded MNIST,
6 epochs, the same split and seeds), then reads the rows left in each bank at the end of the fit, with
the labels they were deposited with. ``FailureReplay`` replays these rows, except those deposited at
the last validation, which comes after the last training epoch. Each bank is read by:

- ``pretrained``: the zoo's ``mnist_a`` (``dlguard.zoo.pretrained``; 15 epochs on 4,000 embedded
  digits without augmentation, among them every training digit here and about a third of the
  validation digits the banks come from), a network of the same architecture that no loop probed;
- ``plain``: the plain-trained network of the same seed. It is the loop's network until the first
  validation (loops change nothing before it), so it is not independent of the failures deposited there;
- ``classes``: how many of the ten digits the bank's rows cover, and the largest class's share.

A reader's accuracy on a bank says how hard its rows are for a model that did not choose them. Both
banks hold the same number of rows, deposited at the same validations (the control follows the
loop's dose), so the two readings compare what detection chose against what chance gives. A seed
whose loop deposited nothing (HDA's can) reads as ``{"rows": 0}`` and is left out of the means.
``--picture`` draws the first 48 rows of each bank of the first seed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from statistics import mean
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).parent))
import closed_loop as cl

from dlguard.zoo import pretrained


def bank_rows(arm: cl.Arm) -> tuple[Tensor, Tensor]:
    """The rows left in the bank of ``arm``'s ``FailureReplay``.

    Args:
        arm: a loop's or a control's arm after its fit (one ``FailureReplay`` among its callbacks).

    Returns:
        Every origin's inputs and labels, concatenated (empty tensors for an empty bank).
    """
    (replay,) = [c for c in arm.callbacks if isinstance(c, cl.FailureReplay)]
    origins = list(replay.bank.origins())
    if not origins:
        return torch.empty(0), torch.empty(0, dtype=torch.long)
    inputs = torch.cat([replay.bank.inputs(origin) for origin in origins])
    return inputs, torch.cat([replay.bank.labels(origin) for origin in origins])


def reading(inputs: Tensor, labels: Tensor, readers: dict[str, nn.Module], classes: int = 10) -> dict[str, int | float]:
    """How a bank's rows read.

    Args:
        inputs: the rows ``(N, ...)``.
        labels: their deposited labels ``(N,)``.
        readers: name -> a classifier of ``inputs`` (put in eval mode).
        classes: the number of classes.

    Returns:
        ``rows``; for ``N > 0`` also each reader's accuracy under its name, ``classes`` (how many
        classes the rows cover) and ``largest_class_share``.
    """
    record: dict[str, int | float] = {"rows": len(labels)}
    if not len(labels):
        return record
    for name, reader in readers.items():
        with torch.no_grad():
            predicted = reader.eval()(inputs).argmax(1)
        record[name] = round(float((predicted == labels).float().mean()), 4)
    counts = torch.bincount(labels, minlength=classes)
    record["classes"] = int((counts > 0).sum())
    record["largest_class_share"] = round(float(counts.max()) / len(labels), 4)
    return record


def picture(banks: dict[str, tuple[Tensor, Tensor]], path: Path, per_bank: int = 48) -> None:
    """Draw the first ``per_bank`` rows of the loop's bank (titled L and the label) and its control's (C).

    Args:
        banks: the loop's rows, then its control's: name -> (inputs ``(N, C, H, W)``, labels).
        path: the PNG to write (nothing is written when both banks are empty).
        per_bank: rows drawn of each bank.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 16
    rows = sum(-(-min(per_bank, len(labels)) // columns) for _, labels in banks.values())
    if not rows:
        return
    figure, axes = plt.subplots(rows, columns, figsize=(columns, rows * 1.1 + 0.6), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    row = 0
    for tag, (inputs, labels) in zip("LC", banks.values(), strict=True):
        shown = min(per_bank, len(labels))
        for index in range(shown):
            ax = axes[row + index // columns, index % columns]
            ax.imshow(inputs[index].permute(1, 2, 0).squeeze(-1), cmap="gray", vmin=0, vmax=1)
            ax.set_title(f"{tag} {int(labels[index])}", fontsize=8)
        row += -(-shown // columns)
    loop, control = banks
    figure.suptitle(f"what each bank replays: L {loop}, C {control}; with the deposited label", fontsize=10)
    figure.savefig(path, dpi=70, bbox_inches="tight")
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loop", choices=("robustness", "metamorphic", "hda"), default="robustness")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--properties", nargs="+", choices=tuple(cl.PROPERTY_PRESETS), default=None,
        help="the robustness loop's property presets (as closed_loop.py's; default: the trio)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--picture", type=Path, default=None)
    args = parser.parse_args()
    if args.properties is not None and args.loop != "robustness":
        parser.error("--properties: only the robustness loop takes property presets")
    if args.properties:
        cl.PROPERTIES[:] = args.properties
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    setting = cl.mnist_setting()
    control = "hda-open" if args.loop == "hda" else f"{args.loop}-open"
    results: dict[str, list[dict]] = {args.loop: [], control: []}
    for seed in args.seeds:
        doses: dict[str, Any] = {}
        arms: list[cl.Arm] = []
        plain, _ = cl.fit("plain", setting, seed, 6, doses)
        cl.fit(args.loop, setting, seed, 6, doses, keep=arms)
        cl.fit(control, setting, seed, 6, doses, keep=arms)
        readers = {"pretrained": pretrained("mnist_a"), "plain": plain}
        banks = {name: bank_rows(arm) for name, arm in zip((args.loop, control), arms, strict=True)}
        for name, (inputs, labels) in banks.items():
            results[name].append({"seed": seed, **reading(inputs, labels, readers)})
            print(f"seed {seed} {name:>18}: {results[name][-1]}", flush=True)
        if args.picture and seed == args.seeds[0]:
            picture(banks, args.picture)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    for name, runs in results.items():
        read = [run for run in runs if run["rows"]]
        summary = {key: round(mean(run[key] for run in read), 3) for key in ("pretrained", "plain") if read}
        print(f"{name:>18}: mean over the {len(read)} seeds with rows {summary}")


if __name__ == "__main__":
    main()
