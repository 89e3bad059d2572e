"""Device checks for a machine with CUDA (skipped elsewhere; CI has no GPU)."""

from __future__ import annotations

import pytest
import torch

from dlguard.augment import RandomFog, RandomRain, ScoreGuidedPadding
from dlguard.metrics import NeuronCoverage
from dlguard.probes import capture_activations, deletion_mutant_logits, select_layers
from dlguard.zoo import mnist_b

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("effect", [RandomFog, RandomRain, ScoreGuidedPadding])
def test_augmentations_stay_on_the_gpu_and_replay_on_the_cpu(effect) -> None:
    images = torch.rand(8, 3, 64, 64, device="cuda")
    aug = effect(p=1.0).to("cuda")
    out = aug(images)
    assert out.device.type == "cuda" and out.shape == images.shape and 0 <= float(out.min()) <= float(out.max()) <= 1
    params = {k: v.cpu() for k, v in aug._params.items()}
    torch.testing.assert_close(aug.to("cpu")(images.cpu(), params=params), out.cpu(), atol=1e-4, rtol=0)


def test_mutants_and_coverage_match_the_cpu() -> None:
    torch.manual_seed(0)
    model, images = mnist_b().eval(), torch.rand(16, 1, 28, 28)
    on_cpu = deletion_mutant_logits(model, images, 3)
    on_gpu = deletion_mutant_logits(model.cuda(), images.cuda(), 3)
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, atol=1e-4, rtol=1e-4)
    layers = select_layers(model, types=(torch.nn.Conv2d, torch.nn.Linear))
    with torch.no_grad(), capture_activations(model, layers) as acts:
        model(images.cuda())
    sizes = {name: outputs[0].shape[1] for name, outputs in acts.items()}
    metric = NeuronCoverage(sizes).cuda()
    metric.update({name: outputs[0] for name, outputs in acts.items()})
    reference = NeuronCoverage(sizes)
    reference.update({name: outputs[0].cpu() for name, outputs in acts.items()})
    assert float(metric.compute()) == float(reference.compute())


def test_object_relevancy_on_the_gpu_matches_the_cpu(tmp_path) -> None:
    import lightning as L

    from dlguard.augment import object_follow_ups
    from dlguard.callbacks import ObjectRelevancyCallback
    from dlguard.data import SceneDataModule, make_scenes, scene_backgrounds
    from dlguard.data.mnist import embedded_mnist
    from dlguard.generate import object_relevancy_test
    from dlguard.zoo import ClassifierModule

    digits, labels = embedded_mnist()
    scenes = make_scenes(digits[:32], labels[:32])
    backgrounds, _ = scene_backgrounds(4, 32, seed=0)
    follow_ups = object_follow_ups(scenes.images, scenes.masks, backgrounds)
    torch.manual_seed(0)
    model = mnist_b(in_channels=3, input_size=32).eval()
    on_cpu = object_relevancy_test(model, scenes.images, scenes.labels, follow_ups)
    on_gpu = object_relevancy_test(model.cuda(), scenes.images.cuda(), scenes.labels.cuda(), follow_ups.to("cuda"))
    assert on_gpu.logits.device.type == "cuda"
    torch.testing.assert_close(on_gpu.scores.score.cpu(), on_cpu.scores.score, atol=1e-4, rtol=1e-4)

    callback = ObjectRelevancyCallback(probe_size=64)
    trainer = L.Trainer(accelerator="cuda", devices=1, callbacks=[callback], logger=False, default_root_dir=tmp_path,
                        limit_val_batches=2, enable_progress_bar=False)  # fmt: skip
    trainer.validate(ClassifierModule(model.cpu()), datamodule=SceneDataModule(batch_size=64), verbose=False)
    assert 0 <= callback.latest["logged"]["relevancy/score"] <= 1
