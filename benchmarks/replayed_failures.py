"""What a loop replays: its failures against its open-loop control's cases, read by models that did not choose them.

    python benchmarks/replayed_failures.py [--loop robustness|metamorphic|hda] [--seeds 0 1 2]
                                           [--properties framework|label_preserving ...]
                                           [--out results.json] [--picture banks.png]

Trains plain, the loop and its control as ``closed_loop.py`` does (``mnist_a`` on the embedded MNIST,
6 epochs, the same split and seeds), then reads the rows left in each bank at the end of the fit, the
rows ``FailureReplay`` replays, with the labels they were deposited with:

- ``pretrained``: the zoo's ``mnist_a`` (``dlguard.zoo.pretrained``; 15 epochs on 4,000 embedded
  digits without augmentation), a network of the same architecture that the loop never probed;
- ``plain``: the plain-trained network of the same seed;
- ``classes``: how many of the ten digits the bank's rows cover, and the largest class's share.

A reader's accuracy on a bank says how hard its rows are for a model that did not choose them. Both
banks hold the same number of rows, deposited at the same validations (the control follows the
loop's dose), so the two readings compare what detection chose against what chance gives.
``--picture`` draws the first 48 rows of each bank of the first seed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from statistics import mean

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).parent))
import closed_loop as cl

from dlguard.zoo import pretrained


def bank_rows(arm: cl.Arm) -> tuple[Tensor, Tensor]:
    """The rows (inputs, labels) left in the bank of ``arm``'s ``FailureReplay``, every origin's."""
    (replay,) = [c for c in arm.callbacks if isinstance(c, cl.FailureReplay)]
    origins = list(replay.bank.origins())
    if not origins:
        return torch.empty(0), torch.empty(0, dtype=torch.long)
    inputs = torch.cat([replay.bank.inputs(origin) for origin in origins])
    return inputs, torch.cat([replay.bank.labels(origin) for origin in origins])


def reading(inputs: Tensor, labels: Tensor, readers: dict[str, nn.Module], classes: int = 10) -> dict:
    """Each reader's accuracy on the rows; the classes the rows cover and the largest class's share."""
    record: dict = {"rows": len(labels)}
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
    """The first ``per_bank`` rows of the loop's bank (titled L and the label) and its control's (C)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 16
    rows = sum(-(-min(per_bank, len(labels)) // columns) for _, labels in banks.values())
    figure, axes = plt.subplots(rows, columns, figsize=(columns, rows * 1.1 + 0.6))
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
    parser.add_argument("--properties", nargs="+", choices=tuple(cl.PROPERTY_PRESETS), default=["framework"])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--picture", type=Path, default=None)
    args = parser.parse_args()
    cl.PROPERTIES[:] = args.properties
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    setting = cl.mnist_setting()
    control = "hda-open" if args.loop == "hda" else f"{args.loop}-open"
    results: dict[str, list[dict]] = {args.loop: [], control: []}
    for seed in args.seeds:
        doses: dict = {}
        arms: list[cl.Arm] = []
        plain, _ = cl.fit("plain", setting, seed, 6, doses)
        cl.fit(args.loop, setting, seed, 6, doses, arms=arms)
        cl.fit(control, setting, seed, 6, doses, arms=arms)
        readers = {"pretrained": pretrained("mnist_a"), "plain": plain}
        banks = {name: bank_rows(arm) for name, arm in zip((args.loop, control), arms, strict=True)}
        for name, (inputs, labels) in banks.items():
            results[name].append({"seed": seed, **reading(inputs, labels, readers)})
            print(f"seed {seed} {name:>18}: {results[name][-1]}", flush=True)
        if args.picture and seed == args.seeds[0]:
            picture(banks, args.picture)
    for name, runs in results.items():
        summary = {key: round(mean(r[key] for r in runs), 3) for key in ("pretrained", "plain") if key in runs[0]}
        print(f"{name:>18}: mean over seeds {summary}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
